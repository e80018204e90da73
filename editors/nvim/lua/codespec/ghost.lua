--- Ghost text: one suggestion per buffer drawn with extmarks in the `codespec` namespace.
---
--- The first line of the suggestion is inline virtual text at the cursor (it pushes the rest of
--- the real line to the right, as the text will once accepted); the following lines are
--- `virt_lines` below it. Nothing here touches the buffer's text or talks to the server.

local M = {}

M.ns = vim.api.nvim_create_namespace('codespec')
M.hl = 'CodespecSuggestion'

M.hl_more = 'CodespecSuggestionMore'

-- A grey that reads as "not typed yet" on dark and light backgrounds alike.
local CTERM_GREY = 244

function M.define_highlights()
  -- Comment's colours where it has them, but never no colour at all: without true colour
  -- (tmux-256color, no COLORTERM) the default scheme's Comment may have no cterm colour, and
  -- a link would draw the ghost text in the typed text's colour, looking like real code.
  -- `default` lets a colorscheme or the user restyle it; re-run on ColorScheme since
  -- `:hi clear` drops groups it does not know.
  local c = vim.api.nvim_get_hl(0, { name = 'Comment', link = false })
  local hl = {
    fg = c.fg or 0x808080,
    ctermfg = c.ctermfg or CTERM_GREY,
    italic = c.italic,
    cterm = { italic = c.cterm and c.cterm.italic or nil },
    default = true,
  }
  vim.api.nvim_set_hl(0, M.hl, hl)
  vim.api.nvim_set_hl(0, M.hl_more, vim.tbl_extend('force', hl, { italic = true, cterm = { italic = true } }))
end

--- Virtual text is drawn as is: a literal tab would show as `^I` (or a single cell), so tabs
--- are expanded the way the buffer will show them once the text is real.
local function expand_tabs(bufnr, s, start_col)
  if not s:find('\t', 1, true) then
    return s
  end
  local ts = vim.bo[bufnr].tabstop
  local out, width = {}, start_col or 0
  for ch in s:gmatch('[%z\1-\127\194-\244][\128-\191]*') do
    if ch == '\t' then
      local n = ts - (width % ts)
      out[#out + 1] = string.rep(' ', n)
      width = width + n
    else
      out[#out + 1] = ch
      width = width + vim.fn.strdisplaywidth(ch)
    end
  end
  return table.concat(out)
end

--- Screen lines the window shows from its top line through buffer row `row` and the virtual
--- lines below it.
local function height_through(win, top, row)
  local last = vim.api.nvim_buf_line_count(vim.api.nvim_win_get_buf(win)) - 1
  if row >= last then
    return vim.api.nvim_win_text_height(win, { start_row = top }).all
  end
  -- Virtual lines below `row` count as filler above `row + 1`; end_vcol = 0 takes none of that
  -- line's own text.
  return vim.api.nvim_win_text_height(win, { start_row = top, end_row = row + 1, end_vcol = 0 }).all
end

--- Scroll `win` so the virtual lines below `row` are on screen, keeping `row` itself on screen.
--- Returns how many virtual lines still do not fit (the suggestion is taller than the window).
local function fit(win, row)
  local height = vim.api.nvim_win_get_height(win)
  local view = vim.api.nvim_win_call(win, vim.fn.winsaveview)
  local top = view.topline - 1
  local need = height_through(win, top, row)
  while need > height and top < row do
    top = top + 1
    need = height_through(win, top, row)
  end
  if top + 1 ~= view.topline then
    vim.api.nvim_win_call(win, function()
      vim.fn.winrestview({ topline = top + 1 })
    end)
  end
  return math.max(need - height, 0)
end

--- Draw `text` as the suggestion at (row, col), both 0-based, col in bytes. Below the bottom
--- of the window the lines would be hidden while an accept inserts them all, so the window
--- scrolls to show them; when they still do not fit, the last line shown says how many more
--- an accept inserts.
function M.show(bufnr, row, col, text)
  M.clear(bufnr)
  local lines = vim.split(text, '\n', { plain = true })
  local first = table.remove(lines, 1)
  local opts = { hl_mode = 'combine', priority = 1000, right_gravity = false }
  if first ~= '' then
    local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
    local cells = vim.fn.strdisplaywidth(line:sub(1, col))
    opts.virt_text = { { expand_tabs(bufnr, first, cells), M.hl } }
    opts.virt_text_pos = 'inline'
  end
  if #lines > 0 then
    opts.virt_lines = vim.tbl_map(function(l)
      return { { expand_tabs(bufnr, l, 0), M.hl } }
    end, lines)
  end
  local id = vim.api.nvim_buf_set_extmark(bufnr, M.ns, row, col, opts)
  local win = vim.api.nvim_get_current_win()
  if #lines == 0 or vim.api.nvim_win_get_buf(win) ~= bufnr then
    return id
  end
  local hidden = fit(win, row)
  if hidden > 0 then
    -- Keep what fits, minus one line for the note; the extmark keeps the full text in `more`.
    local keep = math.max(#lines - hidden - 1, 0)
    local more = #lines - keep
    opts.virt_lines = vim.list_slice(opts.virt_lines, 1, keep)
    opts.virt_lines[#opts.virt_lines + 1] = {
      { ('… %d more line%s (accept inserts all)'):format(more, more == 1 and '' or 's'), M.hl_more },
    }
    opts.id = id
    vim.api.nvim_buf_set_extmark(bufnr, M.ns, row, col, opts)
    M.hidden[bufnr] = vim.list_slice(lines, keep + 1)
  end
  return id
end

--- Lines of the drawn suggestion that did not fit in the window, per buffer.
M.hidden = {}

function M.clear(bufnr)
  M.hidden[bufnr] = nil
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  end
end

--- What is drawn now, read back from the extmarks: { row, col, text } or nil. Used by
--- `:checkhealth`-style introspection and by the tests, so they see what a user would see.
function M.shown(bufnr)
  local marks = vim.api.nvim_buf_get_extmarks(bufnr, M.ns, 0, -1, { details = true })
  if #marks == 0 then
    return nil
  end
  local _, row, col, d = unpack(marks[1])
  local parts = { '' }
  for _, chunk in ipairs(d.virt_text or {}) do
    parts[1] = parts[1] .. chunk[1]
  end
  local hidden = M.hidden[bufnr]
  for i, vl in ipairs(d.virt_lines or {}) do
    if hidden and i == #d.virt_lines then
      break -- the note, standing for the hidden lines
    end
    local s = ''
    for _, chunk in ipairs(vl) do
      s = s .. chunk[1]
    end
    parts[#parts + 1] = s
  end
  vim.list_extend(parts, hidden or {})
  return {
    row = row,
    col = col,
    text = table.concat(parts, '\n'),
    count = #marks,
    hidden = hidden and #hidden or 0,
  }
end

return M
