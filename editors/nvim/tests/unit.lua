--- Unit checks of the plugin's text handling, no server needed:
---   nvim --headless --clean --cmd 'set rtp^=editors/nvim' -l editors/nvim/tests/unit.lua
--- Exits non-zero with the failing check's message. Normal mode throughout: the cursor sits
--- on the character the text goes before, as the insert-mode cursor would.

local suggest = require('codespec.suggest')
local ghost = require('codespec.ghost')

local function eq(want, got, what)
  if not vim.deep_equal(want, got) then
    error(('%s:\n  want %s\n  got  %s'):format(what, vim.inspect(want), vim.inspect(got)), 2)
  end
end

--- A stand-in for vim.lsp.Client that records what the plugin sends.
local function fake_client(encoding)
  local c = { offset_encoding = encoding, notes = {}, commands = {} }
  function c:notify(method, params)
    table.insert(self.notes, { method, params })
  end
  function c:exec_cmd(command)
    table.insert(self.commands, command)
  end
  function c:cancel_request() end
  return c
end

local function buffer(line)
  local b = vim.api.nvim_create_buf(true, false)
  vim.api.nvim_set_current_buf(b)
  vim.api.nvim_buf_set_lines(b, 0, -1, true, { line })
  return b
end

local function put_cursor_before(b, needle)
  local line = vim.api.nvim_buf_get_lines(b, 0, 1, true)[1]
  local col = assert(line:find(needle, 1, true)) - 1
  vim.api.nvim_win_set_cursor(0, { 1, col })
  return col
end

-- Positions: the server speaks UTF-16 (or UTF-8 when negotiated); the buffer is bytes.
do
  local line = "s = '名前' + na)"
  for _, enc in ipairs({ 'utf-16', 'utf-8', 'utf-32' }) do
    local b = buffer(line)
    local col = put_cursor_before(b, ')')
    local start = assert(line:find('na', 1, true)) - 1
    local function unit(byte) -- a byte column in the client's units
      return enc == 'utf-8' and byte or vim.str_utfindex(line, enc, byte)
    end
    local item = {
      insertText = 'name',
      range = { start = { line = 0, character = unit(start) }, ['end'] = { line = 0, character = unit(col) } },
    }
    local s = suggest._from_item(fake_client(enc), b, item, 0, col)
    eq('me', s and s.text, enc .. ': the part of insertText after the cursor')
    eq('na', s.lead, enc .. ': the part already typed')
    eq(0, s.overlap, enc .. ': nothing after the cursor is replaced')
    -- Text before the cursor that does not match the item: not shown.
    item.insertText = 'other'
    eq(nil, suggest._from_item(fake_client(enc), b, item, 0, col), enc .. ': mismatching item')
  end
end

-- A range that reaches past the cursor replaces that text on accept instead of doubling it.
do
  local b = buffer("s = '名前' + na)")
  local col = put_cursor_before(b, ')')
  local line = vim.api.nvim_buf_get_lines(b, 0, 1, true)[1]
  local client = fake_client('utf-16')
  local item = {
    insertText = 'na_x)',
    range = {
      start = { line = 0, character = vim.str_utfindex(line, 'utf-16', col - 2) },
      ['end'] = { line = 0, character = vim.str_utfindex(line, 'utf-16', col + 1) },
    },
    command = { title = 'accepted', command = 'codespec.didAcceptCompletion', arguments = { 'id-1' } },
  }
  local s = assert(suggest._from_item(client, b, item, 0, col))
  eq({ '_x)', 1 }, { s.text, s.overlap }, 'text and replaced length')
  suggest.state(b).sugg = s
  eq(true, suggest.accept(b, 'all'), 'accept')
  eq({ "s = '名前' + na_x)" }, vim.api.nvim_buf_get_lines(b, 0, -1, true), 'buffer after accept')
  eq({ item.command }, client.commands, 'the item command runs on a whole accept')
  eq(false, suggest.visible(b), 'nothing shown after accepting it all')
end

-- Word and line accepts take exactly their piece, report the accepted length in UTF-16 units
-- of the item's text, and keep the rest shown.
do
  local b = buffer('x = f)')
  local col = put_cursor_before(b, ')')
  local client = fake_client('utf-16')
  local text = 'oo(é, bar)\n    return 1'
  local item = { insertText = text, command = { title = 'a', command = 'codespec.didAcceptCompletion', arguments = { 'id-2' } } }
  suggest.state(b).sugg = assert(suggest._from_item(client, b, item, 0, col))

  suggest.accept(b, 'word')
  eq({ 'x = foo)' }, vim.api.nvim_buf_get_lines(b, 0, -1, true), 'after a word')
  eq('(é, bar)\n    return 1', ghost.shown(b).text, 'the rest is shown')
  suggest.accept(b, 'word')
  eq({ 'x = foo()' }, vim.api.nvim_buf_get_lines(b, 0, -1, true), 'punctuation is a word of its own')
  suggest.accept(b, 'word')
  eq({ 'x = foo(é)' }, vim.api.nvim_buf_get_lines(b, 0, -1, true), 'a non-ASCII letter is a word character')
  suggest.accept(b, 'line')
  eq({ 'x = foo(é, bar))' }, vim.api.nvim_buf_get_lines(b, 0, -1, true), 'the rest of the line')
  eq('\n    return 1', ghost.shown(b).text, 'the next line is still shown')
  eq({ 0, #'x = foo(é, bar)' }, { ghost.shown(b).row, ghost.shown(b).col }, 'drawn at the cursor')
  eq({
    { 'codespec/didPartiallyAcceptCompletion', { item = item, acceptedLength = 2 } },
    { 'codespec/didPartiallyAcceptCompletion', { item = item, acceptedLength = 3 } },
    { 'codespec/didPartiallyAcceptCompletion', { item = item, acceptedLength = 4 } },
    { 'codespec/didPartiallyAcceptCompletion', { item = item, acceptedLength = 10 } },
  }, client.notes, 'partial accept events')
  eq({}, client.commands, 'no accept command before the whole item is taken')
  suggest.accept(b, 'line')
  eq({ 'x = foo(é, bar)', '    return 1)' }, vim.api.nvim_buf_get_lines(b, 0, -1, true), 'the next line')
  eq({ item.command }, client.commands, 'taking the last piece is a whole accept')
end

-- Pieces of a suggestion.
eq('foo', suggest.next_word('foo(bar)'), 'word')
eq('  foo', suggest.next_word('  foo bar'), 'leading blanks go with the word')
eq('(', suggest.next_word('(bar)'), 'punctuation run')
eq('  名前', suggest.next_word('  名前 = 1'), 'a non-ASCII identifier is one word')
eq('\n    ', suggest.next_word('\n    return'), 'a line break takes the indentation')
eq('a = 1', suggest.next_line('a = 1\nb = 2'), 'rest of the line')
eq('\nb = 2', suggest.next_line('\nb = 2\nc'), 'at a line end: the next line')
eq('last', suggest.next_line('last'), 'no line break: everything')

-- Ghost text: one extmark, first line inline, the rest as virtual lines, tabs expanded.
do
  local b = buffer('if x:')
  vim.bo[b].tabstop = 4
  vim.api.nvim_win_set_cursor(0, { 1, 4 })
  ghost.show(b, 0, 4, ' # why\n\treturn 1\n')
  local marks = vim.api.nvim_buf_get_extmarks(b, ghost.ns, 0, -1, { details = true })
  eq(1, #marks, 'one extmark')
  local d = marks[1][4]
  eq('inline', d.virt_text_pos, 'inline virtual text')
  eq({ { { '    return 1', 'CodespecSuggestion' } }, { { '', 'CodespecSuggestion' } } }, d.virt_lines, 'virtual lines')
  eq({ row = 0, col = 4, text = ' # why\n    return 1\n', count = 1 }, ghost.shown(b), 'read back')
  ghost.clear(b)
  eq(nil, ghost.shown(b), 'cleared')
end

io.stdout:write('codespec unit checks passed\n')
