--- Ghost text: one suggestion per buffer drawn with extmarks in the `codespec` namespace.
---
--- The first line of the suggestion is inline virtual text at the cursor (it pushes the rest of
--- the real line to the right, as the text will once accepted); the following lines are
--- `virt_lines` below it. Nothing here touches the buffer's text or talks to the server.

local M = {}

M.ns = vim.api.nvim_create_namespace('codespec')
M.hl = 'CodespecSuggestion'

function M.define_highlights()
  -- `default` lets a colorscheme or the user restyle it; re-run on ColorScheme since
  -- `:hi clear` drops groups it does not know.
  vim.api.nvim_set_hl(0, M.hl, { link = 'Comment', default = true })
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

--- Draw `text` as the suggestion at (row, col), both 0-based, col in bytes.
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
  return vim.api.nvim_buf_set_extmark(bufnr, M.ns, row, col, opts)
end

function M.clear(bufnr)
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
  for _, vl in ipairs(d.virt_lines or {}) do
    local s = ''
    for _, chunk in ipairs(vl) do
      s = s .. chunk[1]
    end
    parts[#parts + 1] = s
  end
  return { row = row, col = col, text = table.concat(parts, '\n'), count = #marks }
end

return M
