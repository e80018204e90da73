--- Drives a headless Neovim through one editor scenario against a real codespec-lsp and writes
--- what it saw to a JSON file; tests/test_nvim.py starts it and judges the result.
---
---   nvim --headless --clean --cmd 'set rtp^=editors/nvim' FILE.py -c 'luafile editors/nvim/tests/driver.lua'
---
--- $CODESPEC_SPEC is a JSON object: { out, cmd, settings, debounce_ms, case, start_keys, type,
--- interval_ms, timeout_ms, accept_after_ms, log_file, type_while_loading }. Keys go through nvim_input, as a UI sends them, from timer
--- callbacks, so Neovim's main loop runs between keystrokes and fires TextChangedI/CursorMovedI
--- for each one as it does for a person typing.

local spec = vim.json.decode((assert(os.getenv('CODESPEC_SPEC'), '$CODESPEC_SPEC is not set')))
local codespec = require('codespec')
local result = { ok = false, case = spec.case, log = {} }

local function log(msg)
  result.log[#result.log + 1] = string.format('%7d ms  %s', vim.uv.now() - result.t0, msg)
end

local function finish(ok, err)
  result.ok = ok
  result.error = err
  -- Shut the server down as an editor does (shutdown, exit) rather than closing its pipes.
  for _, c in ipairs(vim.lsp.get_clients({ name = 'codespec' })) do
    c:stop()
  end
  result.server_stopped = vim.wait(10000, function()
    return #vim.lsp.get_clients({ name = 'codespec' }) == 0
  end, 50)
  local f = assert(io.open(spec.out, 'w'))
  f:write(vim.json.encode(result))
  f:close()
  vim.cmd('qall!')
end

local co
local function step()
  local ok, err = coroutine.resume(co)
  if not ok then
    finish(false, debug.traceback(co, err))
  elseif coroutine.status(co) == 'dead' then
    finish(true)
  end
end

local function sleep(ms)
  vim.defer_fn(step, ms)
  coroutine.yield()
end

local function wait_for(what, pred, timeout_ms)
  local t0 = vim.uv.now()
  while true do
    local v = pred()
    if v then
      return v
    end
    if vim.uv.now() - t0 > (timeout_ms or spec.timeout_ms) then
      local ok, st = pcall(codespec.status)
      error(('timed out after %d ms waiting for %s; plugin state: %s'):format(
        vim.uv.now() - t0,
        what,
        ok and vim.inspect(st) or '?'
      ))
    end
    sleep(20)
  end
end

local function client()
  return vim.lsp.get_clients({ name = 'codespec', bufnr = 0 })[1]
end

local function server_request(method)
  local answer
  client():request(method, vim.empty_dict(), function(err, res)
    answer = { err = err, res = res }
  end, 0)
  wait_for(method, function()
    return answer
  end, 10000)
  if answer.err then
    error(method .. ': ' .. vim.inspect(answer.err))
  end
  return answer.res
end

local function server_stats()
  return server_request('codespec/stats')
end

local function lines()
  return vim.api.nvim_buf_get_lines(0, 0, -1, true)
end

local function cursor()
  local c = vim.api.nvim_win_get_cursor(0)
  return { c[1] - 1, c[2] }
end

local function type_slowly(text, interval_ms)
  for ch in text:gmatch('[%z\1-\127\194-\244][\128-\191]*') do
    vim.api.nvim_input(ch == '<' and '<lt>' or ch)
    sleep(interval_ms)
  end
end

--- Wait until a suggestion is drawn and no request is in flight, so what is drawn is final.
local function settled_suggestion(what)
  return wait_for(what, function()
    local st = codespec.status()
    if st.shown and not st.in_flight then
      local sugg = require('codespec.suggest').state(vim.api.nvim_get_current_buf()).sugg
      st.shown_at_ms = sugg and sugg.shown_at
      return st
    end
  end)
end

--- A fresh request at the cursor, outside the plugin: what the newest suggestion should be.
local function fresh_answer()
  local c = client()
  local params = vim.lsp.util.make_position_params(0, c.offset_encoding)
  params.context = { triggerKind = 1 }
  local resp = c:request_sync('textDocument/inlineCompletion', params, 60000)
  assert(resp and not resp.err, 'fresh request failed: ' .. vim.inspect(resp))
  local items = resp.result and (resp.result.items or resp.result) or {}
  local item = items[1]
  if not item then
    return nil
  end
  local text = type(item.insertText) == 'table' and item.insertText.value or item.insertText
  if item.range then
    -- The plugin shows only what goes after the cursor.
    local row, col = unpack(cursor())
    local line = lines()[row + 1]
    local s = vim.str_byteindex(line, c.offset_encoding, item.range.start.character, false)
    text = text:sub(col - s + 1)
  end
  return text
end

local cases = {}

--- Type, see the suggestion, take one word, type one character of it, then accept the rest.
function cases.accept()
  type_slowly(spec.type, spec.interval_ms)
  local early = settled_suggestion('the first suggestion')
  -- Tab at once, before the suggestion can have been seen (accept_after_ms): it is a Tab.
  local line_before = vim.api.nvim_get_current_line()
  vim.api.nvim_input('<Tab>')
  wait_for('the early Tab', function()
    return vim.api.nvim_get_current_line() ~= line_before
  end, 5000)
  result.early_tab = {
    shown_for_ms = vim.uv.now() - early.shown_at_ms,
    line_before = line_before,
    line_after = vim.api.nvim_get_current_line(),
    counts = vim.deepcopy(codespec.status().counts),
  }
  -- Take the Tab back: the plugin asks again for the same text.
  vim.api.nvim_input('<BS>')
  local st = settled_suggestion('the suggestion after the early Tab')
  -- Now let it be seen.
  sleep(spec.accept_after_ms + 100)
  st = codespec.status()
  result.suggestion = st.shown.text
  result.before = lines()
  result.cursor_before = cursor()
  result.shown_at = { st.shown.row, st.shown.col }
  log('shown: ' .. vim.inspect(st.shown.text))

  -- Next word, when the suggestion has more than one (else taking a word takes it all).
  if require('codespec.suggest').next_word(st.shown.text) ~= st.shown.text then
    vim.api.nvim_input('<M-Right>')
    wait_for('the word accept', function()
      return codespec.status().counts.partially_accepted == 1
    end, 5000)
    sleep(50)
    result.after_word = { lines = lines(), shown = codespec.status().shown, cursor = cursor() }
  end

  -- Typing-through: the next character of the suggestion keeps the rest shown, no new request.
  local remaining = codespec.status().shown
  if remaining and #remaining.text > 1 and remaining.text:sub(1, 1):match('[%w_%(%)%[%]:.,=+ ]') then
    local requested = codespec.status().counts.requested
    vim.api.nvim_input(remaining.text:sub(1, 1))
    sleep(200)
    local now = codespec.status()
    result.after_type_through = {
      typed = remaining.text:sub(1, 1),
      shown = now.shown,
      new_requests = now.counts.requested - requested,
      typed_through = now.counts.typed_through,
    }
  end

  vim.api.nvim_input('<Tab>')
  wait_for('the accept', function()
    return codespec.status().counts.accepted == 1
  end, 5000)
  sleep(100)
  result.after = lines()
  result.cursor_after = cursor()
  result.counts = codespec.status().counts
  result.stats = server_stats()
  -- Not part of the stats contract: the server's own tally of the accept events it received.
  local ok, counters = pcall(server_request, 'codespec/counters')
  result.counters = ok and counters or nil

  vim.cmd('stopinsert')
  sleep(50)
  result.after_leave = codespec.status().shown or vim.NIL
  vim.cmd('checkhealth codespec')
  result.health = vim.api.nvim_buf_get_lines(0, 0, -1, false)
end

--- Type faster than the server answers, with no client debounce: every keystroke asks and
--- cancels the previous request; only the newest answer may be drawn.
function cases.fast()
  type_slowly(spec.type, spec.interval_ms)
  result.typed_at = cursor()
  local st = settled_suggestion('a suggestion after fast typing')
  result.shown = st.shown
  result.cursor = cursor()
  result.counts = st.counts
  result.extmarks = #vim.api.nvim_buf_get_extmarks(0, require('codespec.ghost').ns, 0, -1, {})
  result.fresh = fresh_answer()
  result.lines = lines()
  result.stats = server_stats()

  -- :CodespecStats puts the stats in the message history.
  vim.cmd('stopinsert')
  vim.cmd('CodespecStats')
  result.stats_echo = wait_for('the :CodespecStats message', function()
    local m = vim.fn.execute('messages')
    return m:find('typing_through_hits', 1, true) and m:find('this buffer', 1, true) and m
  end, 10000)

  -- :CodespecRestart: a new server process for the same buffer, which loads again.
  local old = client().id
  vim.cmd('CodespecRestart')
  local new = wait_for('a restarted server', function()
    local c = client()
    return c and c.id ~= old and c
  end, 30000)
  result.restart = { old = old, new = new.id }
  result.restart.stats = wait_for('the restarted server to load', function()
    local s = server_stats()
    return s.state == 'ready' and s
  end)
end

--- Type while the models load, then stop: the answers are empty until they are ready, and
--- the plugin asks again by itself when the server says so. Then :CodespecLog.
function cases.ready()
  type_slowly(spec.type, spec.interval_ms)
  result.typed_at = cursor()
  result.counts_after_typing = vim.deepcopy(codespec.status().counts)
  result.state_after_typing = server_stats().state
  local st = settled_suggestion('a suggestion with no further keystroke')
  result.shown = st.shown
  result.cursor = cursor()
  result.counts = st.counts
  vim.cmd('stopinsert')
  vim.cmd('CodespecLog')
  result.log_buffer = vim.api.nvim_buf_get_name(0)
  result.log_lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
end

co = coroutine.create(function()
  result.t0 = vim.uv.now()
  result.nvim = tostring(vim.version())
  codespec.setup({
    cmd = spec.cmd,
    settings = spec.settings or {},
    debounce_ms = spec.debounce_ms,
    accept_after_ms = spec.accept_after_ms or 200,
    log_file = spec.log_file or false,
  })
  -- The buffer was loaded before setup (as with a lazy-loaded plugin): setup attaches it.
  wait_for('the server to start', client, 30000)
  log('client attached')
  if spec.type_while_loading then
    -- Initialized: the models load from now on, in the background.
    wait_for('the initialize answer', function()
      return client().initialized
    end, 60000)
  else
    local stats = wait_for('the models to load', function()
      local s = server_stats()
      if s.state == 'error' then
        error('server failed to load its models: ' .. vim.inspect(s))
      end
      return s.state == 'ready' and s
    end)
    log('server ready: ' .. vim.inspect(stats))
    result.ready_stats = stats
  end
  vim.api.nvim_input(spec.start_keys)
  wait_for('insert mode', function()
    return vim.api.nvim_get_mode().mode == 'i'
  end, 5000)
  sleep(spec.type_while_loading and 0 or 100)
  assert(cases[spec.case], 'unknown case ' .. tostring(spec.case))()
  log('done')
end)

-- A hard stop, so a hang still leaves a result for the test to report.
vim.defer_fn(function()
  if coroutine.status(co) ~= 'dead' then
    finish(false, 'driver timed out; log:\n' .. table.concat(result.log, '\n'))
  end
end, spec.timeout_ms * 3)

vim.schedule(step)
