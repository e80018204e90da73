--- codespec: inline completions from `codespec-lsp` in Neovim.
---
---   require('codespec').setup{ cmd = {...}, filetypes = {...}, debounce_ms = 50, keymaps = {...} }
---
--- One server process serves every buffer of the configured filetypes (the models are loaded
--- once). On Neovim 0.12+ with `native = true` the built-in `vim.lsp.inline_completion` draws and
--- accepts; otherwise codespec.suggest does (0.10, 0.11, or 0.12 by default, since the built-in
--- one has no word/line accept).

local suggest = require('codespec.suggest')
local ghost = require('codespec.ghost')

local M = {}

M.defaults = {
  cmd = { 'codespec-lsp' },
  filetypes = { 'python' },
  -- Only decides the workspace folder the server is told about; one server serves all roots.
  root_markers = { 'pyproject.toml', 'setup.py', 'setup.cfg', '.git' },
  -- Client-side quiet time before asking. The server debounces and supersedes too, so this only
  -- saves messages; 0 asks on every keystroke.
  debounce_ms = 50,
  -- Server settings, sent as initializationOptions and on :CodespecRestart; camelCase as the
  -- server reads them: preset, draft, target, device, maxTokens, debounceMs, timeBudgetMs, contextTokens, enable,
  -- workspaceContext (default true: definitions of imported names, the most similar lines of
  -- another file, from the open buffers and the root_markers folder, and the lines last edited
  -- in other buffers; false: off).
  settings = {},
  -- false disables one; accept falls back to the key's own meaning when nothing is shown.
  keymaps = {
    accept = '<Tab>',
    accept_word = '<M-Right>',
    accept_line = '<M-Down>',
    dismiss = '<C-]>',
  },
  native = false,
  enabled = true,
  -- The server's log level (its `logLevel` setting): 'debug' adds one line per request.
  -- nil keeps the server's default.
  log_level = nil,
  -- The server writes its log here (`--log-file`) with each line's own level; :CodespecLog opens
  -- it. Neovim's LSP log files every stderr line as [ERROR], whatever its level. false: no file.
  log_file = vim.fn.stdpath('log') .. '/codespec-lsp.log',
  -- A suggestion younger than this does not take an accept key: the user cannot have seen it,
  -- and the key (a Tab meant as indentation) keeps its own meaning.
  accept_after_ms = 200,
}

M.config = nil

local function native()
  return M.config.native and vim.lsp.inline_completion ~= nil
end

--- An empty Lua table encodes as a JSON list; the server wants an object.
local function object(t)
  return next(t) == nil and vim.empty_dict() or t
end

--- The settings the server is sent: the user's, plus logLevel from `log_level`.
function M.server_settings()
  local s = vim.deepcopy(M.config.settings or {})
  if M.config.log_level and s.logLevel == nil then
    s.logLevel = M.config.log_level
  end
  return object(s)
end

--- The command line: the user's, plus --log-file unless it names one already.
function M.server_cmd()
  local cmd = vim.deepcopy(M.config.cmd)
  if type(cmd) ~= 'table' or not M.config.log_file or vim.tbl_contains(cmd, '--log-file') then
    return cmd
  end
  vim.fn.mkdir(vim.fs.dirname(M.config.log_file), 'p')
  cmd[#cmd + 1] = '--log-file'
  cmd[#cmd + 1] = M.config.log_file
  return cmd
end

--- The log file the server writes, from --log-file in its command line.
function M.log_file()
  local cmd = M.server_cmd()
  for i, arg in ipairs(type(cmd) == 'table' and cmd or {}) do
    if arg == '--log-file' then
      return cmd[i + 1]
    end
  end
end

local function on_ready(client_id)
  local client = vim.lsp.get_client_by_id(client_id)
  if client and client.name == 'codespec' then
    suggest.on_ready(client)
  end
end

local function server_config(bufnr)
  local cfg = M.config
  local settings = M.server_settings()
  return {
    name = 'codespec',
    cmd = M.server_cmd(),
    root_dir = vim.fs.root(bufnr, cfg.root_markers) or vim.fn.getcwd(),
    init_options = settings,
    -- Answers a `workspace/configuration` pull for the `codespec` section.
    settings = { codespec = settings },
    handlers = {
      -- The models are loaded: ask again at the cursor, so a user who typed while they loaded
      -- and then paused gets a suggestion without another keystroke.
      ['codespec/ready'] = function(_, _, ctx)
        on_ready(ctx.client_id)
      end,
    },
  }
end

local function same_server(client, config)
  return client.name == config.name and not client:is_stopped()
end

local function map_keys(bufnr)
  local km = M.config.keymaps or {}
  local function map(lhs, rhs_when_shown, desc)
    if not lhs then
      return
    end
    -- An expr map runs under textlock, so it only decides; the edit runs in the <Cmd> it returns.
    vim.keymap.set('i', lhs, function()
      if suggest.acceptable(bufnr) then
        return rhs_when_shown
      end
      return lhs
    end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = desc })
  end
  if native() then
    vim.keymap.set('i', km.accept or '<Tab>', function()
      if not vim.lsp.inline_completion.get() then
        return km.accept or '<Tab>'
      end
    end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = 'codespec: accept' })
    return
  end
  map(km.accept, '<Cmd>lua require("codespec").accept()<CR>', 'codespec: accept suggestion')
  map(km.accept_word, '<Cmd>lua require("codespec").accept_word()<CR>', 'codespec: accept word')
  map(km.accept_line, '<Cmd>lua require("codespec").accept_line()<CR>', 'codespec: accept line')
  -- Dismiss needs no delay: it only hides.
  if km.dismiss then
    vim.keymap.set('i', km.dismiss, function()
      return suggest.visible(bufnr) and '<Cmd>lua require("codespec").dismiss()<CR>' or km.dismiss
    end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = 'codespec: dismiss' })
  end
end

local attached = {}

--- Start (or reuse) the server for this buffer.
function M.attach(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  if not vim.api.nvim_buf_is_valid(bufnr) or vim.bo[bufnr].buftype ~= '' then
    return
  end
  local id = vim.lsp.start(server_config(bufnr), { bufnr = bufnr, reuse_client = same_server })
  if not id then
    return
  end
  if not attached[bufnr] then
    attached[bufnr] = true
    map_keys(bufnr)
  end
  if native() then
    vim.lsp.inline_completion.enable(M.config.enabled, { bufnr = bufnr })
  end
  return id
end

function M.accept()
  return suggest.accept(0, 'all')
end

function M.accept_word()
  return suggest.accept(0, 'word')
end

function M.accept_line()
  return suggest.accept(0, 'line')
end

function M.dismiss()
  suggest.dismiss(vim.api.nvim_get_current_buf())
end

--- Ask now, bypassing the debounce.
function M.trigger()
  suggest.trigger(0)
end

function M.toggle()
  M.config.enabled = not M.config.enabled
  suggest.opts.enabled = M.config.enabled
  if not M.config.enabled then
    for bufnr in pairs(attached) do
      suggest.dismiss(bufnr)
    end
  end
  if native() then
    vim.lsp.inline_completion.enable(M.config.enabled)
  end
  vim.notify('codespec: ' .. (M.config.enabled and 'enabled' or 'disabled'))
end

--- `codespec/stats` from the server of the current buffer (or any codespec server).
--- `callback(err, stats)`; with no callback, waits up to `timeout_ms` and returns them.
function M.stats(callback, timeout_ms)
  local client = suggest.client(vim.api.nvim_get_current_buf())
    or vim.lsp.get_clients({ name = 'codespec' })[1]
  if not client then
    local err = { message = 'no codespec-lsp server is running (open a ' .. table.concat(
      M.config and M.config.filetypes or M.defaults.filetypes,
      '/'
    ) .. ' buffer to start one)' }
    if callback then
      return callback(err, nil)
    end
    return nil, err
  end
  if callback then
    if vim.fn.has('nvim-0.11') == 1 then
      return client:request('codespec/stats', vim.empty_dict(), callback)
    end
    return client.request('codespec/stats', vim.empty_dict(), callback)
  end
  local resp, err
  if vim.fn.has('nvim-0.11') == 1 then
    resp, err = client:request_sync('codespec/stats', vim.empty_dict(), timeout_ms or 2000)
  else
    resp, err = client.request_sync('codespec/stats', vim.empty_dict(), timeout_ms or 2000)
  end
  if not resp then
    return nil, { message = err or 'no answer' }
  end
  return resp.result, resp.err
end

local function fmt(v)
  if type(v) == 'number' and v ~= math.floor(v) then
    return string.format('%.3f', v)
  end
  return type(v) == 'table' and vim.inspect(v) or tostring(v)
end

function M.show_stats()
  M.stats(function(err, stats)
    if err then
      vim.notify('codespec: ' .. (err.message or vim.inspect(err)), vim.log.levels.ERROR)
      return
    end
    local lines = { 'codespec-lsp' }
    local keys = vim.tbl_keys(stats or {})
    table.sort(keys)
    for _, k in ipairs(keys) do
      lines[#lines + 1] = string.format('  %-26s %s', k, fmt(stats[k]))
    end
    local bufnr = vim.api.nvim_get_current_buf()
    if attached[bufnr] then
      lines[#lines + 1] = 'this buffer (client side)'
      local counts = suggest.state(bufnr).counts
      local ck = vim.tbl_keys(counts)
      table.sort(ck)
      for _, k in ipairs(ck) do
        lines[#lines + 1] = string.format('  %-26s %s', k, counts[k])
      end
    end
    vim.api.nvim_echo({ { table.concat(lines, '\n') } }, true, {})
  end)
end

--- Stop the server(s) and start a fresh one for every buffer they served.
function M.restart()
  local bufs, clients = {}, vim.lsp.get_clients({ name = 'codespec' })
  for _, client in ipairs(clients) do
    for b in pairs(client.attached_buffers) do
      bufs[#bufs + 1] = b
      suggest.dismiss(b)
    end
    if vim.fn.has('nvim-0.11') == 1 then
      client:stop()
    else
      client.stop()
    end
  end
  if #bufs == 0 then
    for b in pairs(attached) do
      bufs[#bufs + 1] = b
    end
  end
  local started = vim.uv.now()
  local function again()
    local left = vim.lsp.get_clients({ name = 'codespec' })
    if #left > 0 then
      if vim.uv.now() - started < 5000 then
        return vim.defer_fn(again, 50)
      end
      for _, c in ipairs(left) do
        if vim.fn.has('nvim-0.11') == 1 then
          c:stop(true)
        else
          c.stop(true)
        end
      end
    end
    for _, b in ipairs(bufs) do
      if vim.api.nvim_buf_is_valid(b) then
        M.attach(b)
      end
    end
  end
  again()
end

local function define_commands()
  local cmd = vim.api.nvim_create_user_command
  cmd('CodespecStats', M.show_stats, { desc = 'codespec-lsp: show codespec/stats' })
  cmd('CodespecRestart', M.restart, { desc = 'codespec-lsp: restart the server' })
  cmd('CodespecToggle', M.toggle, { desc = 'codespec-lsp: turn suggestions on or off' })
  cmd('CodespecLog', function()
    -- The server's own file keeps each line's level; without one, the LSP client log (where
    -- stderr lines are all filed as [ERROR] by Neovim, whatever their level).
    local file = M.log_file()
    if not (file and vim.uv.fs_stat(file)) then
      file = vim.lsp.get_log_path()
    end
    vim.cmd.split(vim.fn.fnameescape(file))
  end, { desc = 'codespec-lsp: open the server log' })
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  -- A list is replaced, not merged index by index.
  if opts and opts.cmd then
    M.config.cmd = opts.cmd
  end
  if opts and opts.filetypes then
    M.config.filetypes = opts.filetypes
  end
  suggest.opts.debounce_ms = M.config.debounce_ms
  suggest.opts.enabled = M.config.enabled
  suggest.opts.accept_after_ms = M.config.accept_after_ms
  ghost.define_highlights()
  define_commands()

  local group = vim.api.nvim_create_augroup('codespec', { clear = true })
  local au = vim.api.nvim_create_autocmd
  au('FileType', {
    group = group,
    pattern = M.config.filetypes,
    callback = function(ev)
      M.attach(ev.buf)
    end,
  })
  au('ColorScheme', { group = group, callback = ghost.define_highlights })
  -- The end of the load progress says the same as codespec/ready: older servers send only it.
  au('LspProgress', {
    group = group,
    pattern = 'end',
    callback = function(ev)
      local value = ev.data and ev.data.params and ev.data.params.value or {}
      if value.message == 'ready' then
        on_ready(ev.data.client_id)
      end
    end,
  })
  au('BufWipeout', {
    group = group,
    callback = function(ev)
      attached[ev.buf] = nil
      suggest.forget(ev.buf)
    end,
  })
  if not native() then
    au({ 'InsertEnter', 'TextChangedI', 'CursorMovedI' }, {
      group = group,
      callback = function(ev)
        if attached[ev.buf] then
          suggest.on_change(ev.buf)
        end
      end,
    })
    au({ 'InsertLeave', 'BufLeave' }, {
      group = group,
      callback = function(ev)
        if attached[ev.buf] then
          suggest.on_insert_leave(ev.buf)
        end
      end,
    })
  end

  -- Lazy loaders call setup after the buffer's FileType event has passed.
  local fts = {}
  for _, ft in ipairs(M.config.filetypes) do
    fts[ft] = true
  end
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(b) and fts[vim.bo[b].filetype] then
      M.attach(b)
    end
  end
end

--- For tests and status lines: client-side counts and what is drawn in a buffer.
function M.status(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local st = suggest.state(bufnr)
  return {
    counts = vim.deepcopy(st.counts),
    in_flight = st.req and st.req.id or nil,
    shown = ghost.shown(bufnr),
  }
end

return M
