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
  eq({ row = 0, col = 4, text = ' # why\n    return 1\n', count = 1, hidden = 0 }, ghost.shown(b), 'read back')
  ghost.clear(b)
  eq(nil, ghost.shown(b), 'cleared')
end

-- A multi-line suggestion at the bottom of the window: the window scrolls so every line an
-- accept would insert is on screen, with the cursor line still on it.
local function screen_lines_through_ghost(win, row)
  local top = vim.fn.line('w0') - 1
  return vim.api.nvim_win_text_height(win, { start_row = top, end_row = row + 1, end_vcol = 0 }).all
end

do
  local lines = {}
  for i = 1, 60 do
    lines[i] = 'x' .. i .. ' = ' .. i
  end
  local b = vim.api.nvim_create_buf(true, false)
  vim.api.nvim_set_current_buf(b)
  vim.api.nvim_buf_set_lines(b, 0, -1, true, lines)
  local win = vim.api.nvim_get_current_win()
  local height = vim.api.nvim_win_get_height(win)
  -- The cursor on the window's last line.
  vim.api.nvim_win_set_cursor(0, { height, 0 })
  vim.cmd('redraw')
  eq(1, vim.fn.line('w0'), 'starts at the top')
  local row = height - 1
  ghost.show(b, row, 0, 'a\nb\nc\nd\ne')
  vim.cmd('redraw')
  eq(true, screen_lines_through_ghost(win, row) <= height, 'the 4 lines below the cursor are on screen')
  eq(true, vim.fn.line('w0') > 1 and vim.fn.line('w$') >= row + 1, 'scrolled, cursor line still shown')
  eq({ 'a\nb\nc\nd\ne', 0 }, { ghost.shown(b).text, ghost.shown(b).hidden }, 'nothing hidden')

  -- Taller than the window: what fits is shown, the last line says how many more an accept inserts.
  local tall = {}
  for i = 1, height + 10 do
    tall[i] = 'line' .. i
  end
  ghost.show(b, row, 0, table.concat(tall, '\n'))
  vim.cmd('redraw')
  local d = vim.api.nvim_buf_get_extmarks(b, ghost.ns, 0, -1, { details = true })[1][4]
  local note = d.virt_lines[#d.virt_lines][1]
  eq('CodespecSuggestionMore', note[2], 'the note has its own highlight')
  local more = #tall - #d.virt_lines
  eq(('… %d more lines (accept inserts all)'):format(more), note[1], 'the note counts the hidden lines')
  eq(row + 1, vim.fn.line('w0'), 'the cursor line went to the top')
  eq(true, screen_lines_through_ghost(win, row) <= height, 'what is drawn fits')
  eq(table.concat(tall, '\n'), ghost.shown(b).text, 'read back: the whole suggestion')
  ghost.clear(b)
end

-- Without true colour the ghost text still has a colour of its own (not the text's).
do
  vim.o.termguicolors = false
  ghost.define_highlights()
  local hl = vim.api.nvim_get_hl(0, { name = 'CodespecSuggestion', link = false })
  eq(true, hl.ctermfg ~= nil and hl.fg ~= nil, 'cterm and gui colours: ' .. vim.inspect(hl))
  eq(nil, hl.link, 'not a link')
  -- The user's own definition wins.
  vim.api.nvim_set_hl(0, 'CodespecSuggestion', { ctermfg = 33 })
  ghost.define_highlights()
  eq(33, vim.api.nvim_get_hl(0, { name = 'CodespecSuggestion' }).ctermfg, 'a user definition is kept')
end

-- An accept key that comes before the suggestion could be seen keeps its own meaning.
do
  local b = buffer('x = f')
  local col = #'x = f'
  local client = fake_client('utf-16')
  local st = suggest.state(b)
  st.sugg = assert(suggest._from_item(client, b, { insertText = 'oo()' }, 0, col))
  suggest.opts.accept_after_ms = 200
  eq(false, suggest.acceptable(b), 'just shown: not acceptable')
  eq(1, st.counts.too_early, 'counted')
  st.sugg.shown_at = vim.uv.now() - 250
  eq(true, suggest.acceptable(b), 'shown for 250 ms: acceptable')
  st.sugg = nil
  eq(false, suggest.acceptable(b), 'nothing shown')
end

-- setup({}) sends an object, not a list; log_level goes as logLevel; --log-file is added once.
do
  local codespec = require('codespec')
  codespec.setup({ cmd = { 'codespec-lsp' }, log_file = vim.fn.tempname() .. '/codespec.log' })
  eq('{}', vim.json.encode(codespec.server_settings()), 'empty settings encode as an object')
  codespec.setup({ settings = { preset = 'tiny' }, log_level = 'debug', log_file = false })
  eq({ preset = 'tiny', logLevel = 'debug' }, codespec.server_settings(), 'log_level is sent as logLevel')
  eq({ 'codespec-lsp' }, codespec.server_cmd(), 'log_file = false: no --log-file')
  local tmplog = vim.fn.tempname() .. '/b.log'
  codespec.setup({ cmd = { 'x', 'serve' }, log_file = tmplog })
  eq({ 'x', 'serve', '--log-file', tmplog }, codespec.server_cmd(), 'the log file is added')
  eq(tmplog, codespec.log_file(), 'and read back')
  codespec.setup({ cmd = { 'x', '--log-file', '/tmp/mine.log' }, log_file = tmplog })
  eq({ 'x', '--log-file', '/tmp/mine.log' }, codespec.server_cmd(), "the user's own --log-file wins")
  eq('/tmp/mine.log', codespec.log_file(), 'and :CodespecLog opens it')
end

io.stdout:write('codespec unit checks passed\n')
