--- Suggestions for Neovim 0.10/0.11 (no native inline completion): ask, keep the newest, draw, accept.
---
--- Promises, per buffer:
---   * at most one `textDocument/inlineCompletion` request in flight: a new one first cancels the
---     old one with `$/cancelRequest` (the server also supersedes, but a client that says so
---     saves the server a forward pass);
---   * an answer is drawn only if the buffer text and cursor are still those it was asked for;
---   * typing the next characters of the shown suggestion consumes them instead of asking again
---     (typing-through); any other edit or cursor move drops the suggestion and asks anew;
---   * accepting inserts exactly the suggested text, runs the item's `command` when the whole
---     item has been taken and sends `codespec/didPartiallyAcceptCompletion` otherwise.

local ghost = require('codespec.ghost')

local M = {}

--- Set by require('codespec').setup().
M.opts = { debounce_ms = 50, enabled = true, accept_after_ms = 200 }

local INVOKED, AUTOMATIC = 1, 2
local REQUEST_CANCELLED = -32800
local has_011 = vim.fn.has('nvim-0.11') == 1

-- 0.11 made Client methods take `self`; 0.10 only has the plain function fields.
local function lsp_request(client, method, params, handler, bufnr)
  if has_011 then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

local function lsp_cancel(client, id)
  if has_011 then
    return client:cancel_request(id)
  end
  return client.cancel_request(id)
end

local function lsp_notify(client, method, params)
  if has_011 then
    return client:notify(method, params)
  end
  return client.notify(method, params)
end

local function byte_col(line, character, encoding)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local ok, col
  if has_011 then
    ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  else
    ok, col = pcall(vim.str_byteindex, line, character, encoding == 'utf-16')
  end
  return ok and col or #line
end

local function utf16_len(s)
  if has_011 then
    return vim.str_utfindex(s, 'utf-16')
  end
  local _, n16 = vim.str_utfindex(s)
  return n16
end

---@class codespec.Suggestion
---@field client vim.lsp.Client
---@field item table        the InlineCompletionItem as the server sent it
---@field lead string       the part of item.insertText already in the buffer when it was asked (range start..cursor)
---@field text string       what goes at the cursor position it was asked at
---@field consumed integer  bytes of `text` already in the buffer (typed through or partly accepted)
---@field overlap integer   bytes after the cursor that the item's range replaces
---@field row integer       where `text` starts, 0-based
---@field col integer
---@field shown_at integer  vim.uv.now() when it was first drawn (typing through keeps it)

---@class codespec.BufState
---@field timer uv.uv_timer_t?
---@field req {client: vim.lsp.Client, id: integer}?
---@field sugg codespec.Suggestion?
---@field key string?  changedtick:row:col last handled: one keystroke fires both TextChangedI and CursorMovedI
---@field counts table

local states = {}

function M.state(bufnr)
  local st = states[bufnr]
  if not st then
    st = {
      counts = {
        requested = 0, -- requests sent
        cancelled = 0, -- of those, cancelled by a newer keystroke before their answer came
        stale = 0, -- answers that came for a text or cursor that had changed: not drawn
        empty = 0, -- answers with no usable item
        shown = 0, -- suggestions drawn
        typed_through = 0, -- keystrokes that matched the suggestion and kept it
        accepted = 0, -- whole suggestions accepted
        partially_accepted = 0,
        too_early = 0, -- accept keys that came before the suggestion could be seen: the key's own meaning
        reasked = 0, -- requests sent because the server said its models became ready
      },
    }
    states[bufnr] = st
  end
  return st
end

function M.forget(bufnr)
  local st = states[bufnr]
  if st then
    M.dismiss(bufnr)
    if st.timer then
      st.timer:close()
    end
    states[bufnr] = nil
  end
end

function M.client(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = 'codespec' })[1]
end

local function here(bufnr)
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  return vim.api.nvim_buf_get_changedtick(bufnr), row - 1, col
end

local function key_of(tick, row, col)
  return tick .. ':' .. row .. ':' .. col
end

local function cancel(st)
  if st.timer then
    st.timer:stop()
  end
  if st.req then
    lsp_cancel(st.req.client, st.req.id)
    st.counts.cancelled = st.counts.cancelled + 1
    st.req = nil
  end
end

--- Drop the suggestion and any request for it.
function M.dismiss(bufnr)
  local st = states[bufnr]
  if not st then
    return
  end
  cancel(st)
  st.sugg = nil
  ghost.clear(bufnr)
end

function M.visible(bufnr)
  local st = states[bufnr]
  return st ~= nil and st.sugg ~= nil
end

--- Whether an accept key should take the suggestion: it is shown, and has been for
--- `accept_after_ms`, so the user can have seen it. A key that comes sooner is counted and keeps
--- its own meaning (a Tab typed as indentation stays a Tab).
function M.acceptable(bufnr)
  local st = states[bufnr]
  if not (st and st.sugg) then
    return false
  end
  if vim.uv.now() - st.sugg.shown_at < (M.opts.accept_after_ms or 0) then
    st.counts.too_early = st.counts.too_early + 1
    return false
  end
  return true
end

local function rest(s)
  return s.text:sub(s.consumed + 1)
end

local function redraw(bufnr, s)
  local _, row, col = here(bufnr)
  ghost.show(bufnr, row, col, rest(s))
end

--- Turn an item into a Suggestion for the cursor at (row, col), or nil if it cannot apply there.
local function from_item(client, bufnr, item, row, col)
  local text = item.insertText
  if type(text) == 'table' then
    -- A StringValue snippet: the plain value is what gets shown and inserted.
    text = text.value
  end
  if type(text) ~= 'string' or not text:find('%S') then
    return nil
  end
  local lead, overlap = '', 0
  if item.range then
    local r = item.range
    if r.start.line ~= row or r['end'].line ~= row then
      return nil
    end
    local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
    local s = byte_col(line, r.start.character, client.offset_encoding)
    local e = byte_col(line, r['end'].character, client.offset_encoding)
    if s > col then
      return nil
    end
    lead = line:sub(s + 1, col)
    if text:sub(1, #lead) ~= lead then
      return nil
    end
    text = text:sub(#lead + 1)
    overlap = math.max(e - col, 0)
  end
  if text == '' then
    return nil
  end
  return {
    client = client,
    item = item,
    lead = lead,
    text = text,
    consumed = 0,
    overlap = overlap,
    row = row,
    col = col,
    shown_at = vim.uv.now(),
  }
end

-- For the unit tests (editors/nvim/tests/unit.lua), which build suggestions without a server.
M._from_item = from_item

--- Ask for a suggestion at the cursor now, cancelling whatever was asked before.
function M.request(bufnr, trigger)
  local client = M.client(bufnr)
  local st = M.state(bufnr)
  cancel(st)
  if not client then
    return
  end
  local tick, row, col = here(bufnr)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = trigger or AUTOMATIC }
  local id
  local ok
  ok, id = lsp_request(client, 'textDocument/inlineCompletion', params, function(err, result)
    if not (st.req and st.req.id == id) then
      return -- cancelled or superseded: already counted
    end
    st.req = nil
    if err then
      if err.code ~= REQUEST_CANCELLED then
        vim.notify('codespec: ' .. (err.message or vim.inspect(err)), vim.log.levels.WARN)
      end
      return
    end
    local now_tick, now_row, now_col = here(bufnr)
    if
      vim.api.nvim_get_current_buf() ~= bufnr
      or not vim.api.nvim_get_mode().mode:find('^i')
      or now_tick ~= tick
      or now_row ~= row
      or now_col ~= col
    then
      st.counts.stale = st.counts.stale + 1
      return
    end
    local items = result and (result.items or result) or {}
    for _, item in ipairs(items) do
      local s = from_item(client, bufnr, item, row, col)
      if s then
        st.sugg = s
        st.counts.shown = st.counts.shown + 1
        redraw(bufnr, s)
        lsp_notify(client, 'codespec/didShowCompletion', { item = item })
        return
      end
    end
    st.counts.empty = st.counts.empty + 1
  end, bufnr)
  if ok and id then
    st.req = { client = client, id = id }
    st.counts.requested = st.counts.requested + 1
  end
end

--- Ask after `debounce_ms` of quiet (0: at once).
function M.schedule(bufnr)
  local st = M.state(bufnr)
  cancel(st)
  local function fire()
    if
      vim.api.nvim_buf_is_valid(bufnr)
      and vim.api.nvim_get_current_buf() == bufnr
      and vim.api.nvim_get_mode().mode:find('^i')
    then
      M.request(bufnr)
    end
  end
  local ms = M.opts.debounce_ms or 0
  if ms <= 0 then
    return fire()
  end
  st.timer = st.timer or vim.uv.new_timer()
  st.timer:start(ms, 0, vim.schedule_wrap(fire))
end

--- If the text between where the suggestion was asked and the cursor is a prefix of it, the
--- user is typing it: keep the rest shown. Returns true when it did.
local function type_through(bufnr, st, row, col)
  local s = st.sugg
  if row < s.row or (row == s.row and col <= s.col) then
    return false
  end
  local ok, lines = pcall(vim.api.nvim_buf_get_text, bufnr, s.row, s.col, row, col, {})
  if not ok then
    return false
  end
  local typed = table.concat(lines, '\n')
  if #typed >= #s.text or s.text:sub(1, #typed) ~= typed then
    return false
  end
  s.consumed = #typed
  st.counts.typed_through = st.counts.typed_through + 1
  redraw(bufnr, s)
  return true
end

--- TextChangedI / CursorMovedI / InsertEnter.
function M.on_change(bufnr)
  if not M.opts.enabled then
    return
  end
  local st = M.state(bufnr)
  local tick, row, col = here(bufnr)
  local key = key_of(tick, row, col)
  if key == st.key then
    return
  end
  st.key = key
  if st.sugg and type_through(bufnr, st, row, col) then
    return
  end
  M.dismiss(bufnr)
  M.schedule(bufnr)
end

function M.on_insert_leave(bufnr)
  M.dismiss(bufnr)
  local st = states[bufnr]
  if st then
    st.key = nil
  end
end

-- Bytes 128-255 are parts of UTF-8 characters: counted as word characters, so a non-ASCII
-- identifier is one word and a multibyte character is never split.
function M.next_word(s)
  return s:match('^\r?\n[ \t]*')
    or s:match('^[ \t]*[%w_\128-\255]+')
    or s:match('^[ \t]*[^%w_%s\128-\255]+')
    or s:match('^[ \t]+')
    or s
end

function M.next_line(s)
  local nl = s:find('\n', 1, true)
  if not nl then
    return s
  end
  if nl > 1 then
    return s:sub(1, nl - 1)
  end
  -- At the end of a line already: take the line break and the whole next line.
  local nl2 = s:find('\n', 2, true)
  return nl2 and s:sub(1, nl2 - 1) or s
end

local function run_command(client, bufnr, command)
  if not command then
    return
  end
  if has_011 then
    client:exec_cmd(command, { bufnr = bufnr }, function() end)
  else
    client.request('workspace/executeCommand', {
      command = command.command,
      arguments = command.arguments,
    }, function() end, bufnr)
  end
end

--- Insert the whole suggestion ('all'), its next word ('word') or the rest of its line ('line').
--- Returns false when there was nothing to accept.
function M.accept(bufnr, how)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local st = states[bufnr]
  local s = st and st.sugg
  if not s then
    return false
  end
  local remaining = rest(s)
  local piece = (how == 'word' and M.next_word(remaining))
    or (how == 'line' and M.next_line(remaining))
    or remaining
  local whole = #piece == #remaining
  local _, row, col = here(bufnr)
  local lines = vim.split(piece, '\n', { plain = true })
  local line_len = #vim.api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]
  local replace_to = whole and math.min(col + s.overlap, line_len) or col
  cancel(st)
  vim.api.nvim_buf_set_text(bufnr, row, col, row, replace_to, lines)
  local end_row = row + #lines - 1
  local end_col = (#lines == 1 and col or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { end_row + 1, end_col })
  s.consumed = s.consumed + #piece
  -- Our own edit is not the user typing: the events it fires must not drop or re-ask.
  st.key = key_of(here(bufnr))
  if whole then
    st.sugg = nil
    ghost.clear(bufnr)
    st.counts.accepted = st.counts.accepted + 1
    run_command(s.client, bufnr, s.item.command)
    -- Ask for what comes next, as after typing.
    M.schedule(bufnr)
  else
    st.counts.partially_accepted = st.counts.partially_accepted + 1
    lsp_notify(s.client, 'codespec/didPartiallyAcceptCompletion', {
      item = s.item,
      acceptedLength = utf16_len(s.lead .. s.text:sub(1, s.consumed)),
    })
    redraw(bufnr, s)
  end
  return true
end

--- The server's models became ready (`codespec/ready`, or the end of its load progress): what
--- was asked while they loaded got empty answers, so ask again at the cursor of the current
--- buffer, if it is in insert mode and shows nothing. The two signals may both come: one re-ask.
function M.on_ready(client)
  local bufnr = vim.api.nvim_get_current_buf()
  local c = M.client(bufnr)
  if not (M.opts.enabled and c and c.id == client.id) then
    return
  end
  local st = M.state(bufnr)
  local now = vim.uv.now()
  if st.ready_at and now - st.ready_at < 1000 then
    return
  end
  st.ready_at = now
  if st.sugg or not vim.api.nvim_get_mode().mode:find('^i') then
    return
  end
  st.counts.reasked = st.counts.reasked + 1
  M.request(bufnr, INVOKED)
end

--- Ask now, without waiting for the debounce (the "invoked" trigger).
function M.trigger(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  M.request(bufnr, INVOKED)
end

return M
