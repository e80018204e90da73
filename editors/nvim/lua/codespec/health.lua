--- `:checkhealth codespec`: the Neovim version, the server binary, each running server's state
--- and models (from `codespec/stats`), and whether it offers inline completion.

local M = {}

local function request_sync(client, method)
  local resp, err
  if vim.fn.has('nvim-0.11') == 1 then
    resp, err = client:request_sync(method, vim.empty_dict(), 3000)
  else
    resp, err = client.request_sync(method, vim.empty_dict(), 3000)
  end
  if resp and resp.result then
    return resp.result
  end
  return nil, err or (resp and resp.err)
end

--- The load error lives in `codespec/counters` (outside the stats contract), when the server has it.
local function load_error(client)
  local counters = request_sync(client, 'codespec/counters')
  if counters and type(counters.error) == 'string' and counters.error ~= '' then
    return counters.error
  end
  return 'see :CodespecLog'
end

function M.check()
  local h = vim.health
  local codespec = require('codespec')
  local cfg = codespec.config

  h.start('codespec: Neovim')
  if vim.fn.has('nvim-0.10') == 0 then
    h.error('Neovim 0.10 or newer is needed (inline virtual text)')
  elseif vim.fn.has('nvim-0.12') == 1 and vim.lsp.inline_completion then
    h.ok('Neovim 0.12+: native vim.lsp.inline_completion available (setup{ native = true })')
  else
    h.ok('Neovim ' .. tostring(vim.version()) .. ': codespec draws the suggestions itself')
  end
  if not cfg then
    h.warn("require('codespec').setup{} has not been called", { 'call it from your config' })
    cfg = codespec.defaults
  else
    h.info('filetypes: ' .. table.concat(cfg.filetypes, ', '))
  end

  h.start('codespec: server binary')
  local exe = cfg.cmd[1]
  if vim.fn.executable(exe) == 1 then
    h.ok(('%s -> %s'):format(table.concat(cfg.cmd, ' '), vim.fn.exepath(exe)))
  else
    -- codespec-lsp is not on PyPI: it installs from a clone of its repository.
    h.error(('`%s` is not executable'):format(exe), {
      'install it from a clone of the repository: `make demo` there (or `bash scripts/setup.sh`) '
        .. 'makes .venv/bin/codespec-lsp; or `pip install -e /path/to/codespec-lsp` in a venv of yours',
      "then point setup{ cmd = { '/path/to/codespec-lsp/.venv/bin/codespec-lsp' } } at it, "
        .. 'or put that bin folder on PATH',
    })
  end

  local log = codespec.config and codespec.log_file()
  if log then
    h.info('server log (:CodespecLog): ' .. log)
  end

  h.start('codespec: running server')
  local clients = vim.lsp.get_clients({ name = 'codespec' })
  if #clients == 0 then
    h.info('no server running: open a ' .. table.concat(cfg.filetypes, '/') .. ' buffer to start one')
    return
  end
  for _, client in ipairs(clients) do
    local caps = client.server_capabilities or {}
    if caps.inlineCompletionProvider then
      h.ok(('client %d: server offers textDocument/inlineCompletion'):format(client.id))
    else
      h.error(('client %d: server does not offer textDocument/inlineCompletion'):format(client.id))
    end
    local stats, err = request_sync(client, 'codespec/stats')
    if not stats then
      h.error(('client %d: codespec/stats failed: %s'):format(client.id, vim.inspect(err)))
    else
      local models = ('draft %s, target %s, device %s'):format(
        tostring(stats.draft),
        tostring(stats.target),
        tostring(stats.device)
      )
      if stats.state == 'ready' then
        h.ok('models ready: ' .. models)
      elseif stats.state == 'loading' then
        h.warn('models loading: ' .. models, { 'suggestions start once loaded' })
      else
        h.error(('models failed to load (%s): %s'):format(models, load_error(client)), {
          'see :CodespecLog for the server log',
        })
      end
      if stats.requests then
        h.info(('%d requests, %d answered, p50 %s ms'):format(
          stats.requests,
          stats.answered or 0,
          tostring(stats.latency_ms_p50)
        ))
      end
    end
  end
end

return M
