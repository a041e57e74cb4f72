// agents.test.mjs - the agent clients our users run, the real binaries from
// npm (pinned in package.json: @anthropic-ai/claude-code, @openai/codex),
// against ds4-server with no client-side compatibility settings: Claude Code
// through ANTHROPIC_BASE_URL, Codex through a custom provider with
// wire_api = "responses". Each runs non-interactively:
//  - on the demo model (models/ds4-demo.gguf) a two-turn session (the
//    second turn resumes the first): both exit 0, the server logs no 4xx,
//    and the second turn's prompt reuses the first turn's session (the
//    system messages inside `messages`, the signed thinking and the
//    replayed history must render byte for byte as before);
//  - on the scripted test engine (which calls the declared *get_weather
//    tool when asked about the weather, and answers "The tool said: ..."
//    from its result) a tool round trip through a real MCP server
//    (weather-mcp.mjs): the client calls the tool, sends the result back,
//    and that turn reuses the prefix. The demo model is too small to call
//    a tool under these clients' long system prompts, hence the script.
// The clients are kept offline: their home directories are temporary, and
// update checks, telemetry and error reporting are switched off.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, repoRoot } from './helpers.mjs';

const here = path.join(repoRoot, 'tests', 'node');
const demo = path.join(repoRoot, 'models', 'ds4-demo.gguf');
const claudeBin = path.join(here, 'node_modules', '@anthropic-ai', 'claude-code', 'bin', 'claude.exe');
const codexBin = path.join(here, 'node_modules', '@openai', 'codex', 'bin', 'codex.js');
const mcpScript = path.join(here, 'weather-mcp.mjs');
const skipClaude = !existsSync(claudeBin) ? 'Claude Code is not installed (npm ci in tests/node)' : false;
const skipCodex = !existsSync(codexBin) ? 'Codex is not installed (npm ci in tests/node)' : false;
const skipDemo = !existsSync(demo) ? 'models/ds4-demo.gguf missing'
  : process.env.DS4_SLOW_TESTS === '0' ? 'DS4_SLOW_TESTS=0 (make asan): a 12K-token prefill on the demo model' : false;

function run(cmd, args, { env, cwd, timeoutMs = 90000 }) {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { env, cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    const timer = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('close', (code) => { clearTimeout(timer); resolve({ code, out, err }); });
  });
}

// The server's request log lines (server/server_log.c, text format).
function requests(stderr) {
  return stderr.split('\n').filter((l) => /^ds4-server: POST \/v1\/\S+ model=/.test(l)).map((l) => ({
    line: l,
    endpoint: l.match(/POST (\S+)/)[1],
    status: Number(l.match(/status=(\d+)/)[1]),
    prompt: Number(l.match(/ prompt=(\d+)/)[1]),
    reused: Number(l.match(/ reused=(\d+)/)[1]),
    cache: l.match(/ cache=(\S+)/)[1],
  }));
}
const errorLines = (stderr) => stderr.split('\n').filter((l) => / status=4\d\d /.test(l));

// The server log and its requests to endpoint, after checking that none was
// answered 4xx and that the client made at least two: a turn, and the turn
// that should reuse it.
function agentTurns(srv, endpoint) {
  const log = srv.stderr();
  assert.deepEqual(errorLines(log), [], log);
  const reqs = requests(log).filter((q) => q.endpoint === endpoint);
  assert.ok(reqs.length >= 2, log);
  return { log, reqs };
}

// The tools/call requests the weather MCP server logged (weather-mcp.mjs).
const mcpToolCalls = (mcpLog) => readFileSync(mcpLog, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l))
  .filter((m) => m.method === 'tools/call');

function tmpHome(tag) {
  const d = mkdtempSync(path.join(os.tmpdir(), `ds4-${tag}-`));
  return d;
}

// ---- Claude Code ------------------------------------------------------------------

function claudeEnv(home, base) {
  const env = { ...process.env, HOME: home, ANTHROPIC_BASE_URL: base, ANTHROPIC_API_KEY: 'sk-ds4-test',
    // offline: no update check, telemetry, error reports or other side traffic
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', DISABLE_AUTOUPDATER: '1', DISABLE_TELEMETRY: '1',
    DISABLE_ERROR_REPORTING: '1', CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY: '1' };
  delete env.ANTHROPIC_AUTH_TOKEN;
  delete env.CLAUDECODE;
  return env;
}

test('Claude Code on the demo model: two turns, no 4xx, the second reuses the first', { skip: skipClaude || skipDemo, timeout: 180000 }, async () => {
  const srv = await startServer(['-m', demo, '--ctx', '32768', '--temp', '0'], { testEngine: false });
  const home = tmpHome('claude');
  try {
    const env = claudeEnv(home, srv.base);
    const r1 = await run(claudeBin, ['-p', 'Hello'], { env, cwd: home });
    assert.equal(r1.code, 0, `claude exited ${r1.code}: ${r1.out}${r1.err}\n${srv.stderr()}`);
    assert.ok(r1.out.trim().length > 0, 'no answer printed');
    const r2 = await run(claudeBin, ['-p', '--continue', 'What is the capital of France?'], { env, cwd: home });
    assert.equal(r2.code, 0, `claude --continue exited ${r2.code}: ${r2.out}${r2.err}\n${srv.stderr()}`);
    const { log, reqs } = agentTurns(srv, '/v1/messages');
    const [first, last] = [reqs[0], reqs[reqs.length - 1]];
    assert.equal(first.status, 200);
    assert.equal(last.status, 200);
    // turn 2 holds turn 1 (prompt, the thinking sent back by its signature,
    // the answer): everything up to there comes from the live session
    assert.ok(last.prompt > first.prompt, log);
    assert.ok(last.reused > first.prompt, `turn 2 reused ${last.reused} tokens, turn 1 had ${first.prompt}: ${last.line}`);
    assert.notEqual(last.cache, 'cold');
  } finally {
    await srv.stop();
    rmSync(home, { recursive: true, force: true });
  }
});

test('Claude Code: an MCP tool call round trip, the result turn reusing the prefix', { skip: skipClaude, timeout: 120000 }, async () => {
  const srv = await startServer(['--ctx', '262144']); // the test engine: a token per byte
  const home = tmpHome('claude-mcp');
  try {
    const mcpLog = path.join(home, 'mcp.log');
    const cfg = path.join(home, 'mcp.json');
    writeFileSync(cfg, JSON.stringify({ mcpServers: { weather: { command: process.execPath, args: [mcpScript],
      env: { WEATHER_MCP_LOG: mcpLog } } } }));
    // MCP tools are otherwise deferred (named in a system message, their
    // schemas loaded through ToolSearch): the script calls a declared tool
    const env = { ...claudeEnv(home, srv.base), ENABLE_TOOL_SEARCH: 'false' };
    const r = await run(claudeBin, ['-p', 'What is the weather in Rome?', '--mcp-config', cfg, '--strict-mcp-config',
      '--allowedTools', 'mcp__weather__get_weather'], { env, cwd: home });
    assert.equal(r.code, 0, `claude exited ${r.code}: ${r.out}${r.err}\n${srv.stderr()}`);
    const calls = mcpToolCalls(mcpLog);
    assert.equal(calls.length, 1, 'the MCP tool was not called');
    assert.equal(calls[0].params.name, 'get_weather');
    assert.deepEqual(calls[0].params.arguments, { city: 'Rome', days: 2 });
    assert.match(r.out, /The tool said: .*Sunny, 21 C in Rome/);
    const { reqs } = agentTurns(srv, '/v1/messages');
    const [call, answer] = reqs.slice(-2);
    assert.ok(answer.reused >= call.prompt, `the tool-result turn reused ${answer.reused} of ${answer.prompt}: ${answer.line}`);
  } finally {
    await srv.stop();
    rmSync(home, { recursive: true, force: true });
  }
});

// ---- Codex ------------------------------------------------------------------------

function codexHome(home, base, extra = '') {
  writeFileSync(path.join(home, 'config.toml'), `model = "deepseek-v4-flash"
model_provider = "ds4"
check_for_update_on_startup = false

[analytics]
enabled = false

[model_providers.ds4]
name = "ds4"
base_url = "${base}/v1"
wire_api = "responses"
${extra}`);
  return { ...process.env, CODEX_HOME: home, HOME: home };
}
const codexArgs = ['exec', '--skip-git-repo-check'];

test('Codex on the demo model: two turns, no 4xx, the second reuses the first', { skip: skipCodex || skipDemo, timeout: 180000 }, async () => {
  const srv = await startServer(['-m', demo, '--ctx', '32768', '--temp', '0'], { testEngine: false });
  const home = tmpHome('codex');
  try {
    const env = codexHome(home, srv.base);
    // 'Hi', not 'Hello': under Codex's prompt the demo model answers
    // 'Hello' greedily with a second </think> token inside its answer; the
    // replayed answer spells it as text, and a prompt that spells a live
    // session's control token as text is prefilled cold by design
    // (docs/SERVER.md, user text never becomes control tokens), so that
    // turn could not show reuse.
    const r1 = await run(process.execPath, [codexBin, ...codexArgs, 'Hi'], { env, cwd: home });
    assert.equal(r1.code, 0, `codex exited ${r1.code}: ${r1.out}${r1.err}\n${srv.stderr()}`);
    const r2 = await run(process.execPath, [codexBin, ...codexArgs, 'resume', '--last', 'What is the capital of France?'], { env, cwd: home });
    assert.equal(r2.code, 0, `codex resume exited ${r2.code}: ${r2.out}${r2.err}\n${srv.stderr()}`);
    const { log, reqs } = agentTurns(srv, '/v1/responses');
    const [first, last] = [reqs[0], reqs[reqs.length - 1]];
    assert.ok(last.prompt > first.prompt, log);
    assert.ok(last.reused > first.prompt, `turn 2 reused ${last.reused} tokens, turn 1 had ${first.prompt}: ${last.line}`);
  } finally {
    await srv.stop();
    rmSync(home, { recursive: true, force: true });
  }
});

test('Codex: an MCP tool (a namespace group) call round trip, the result turn reusing the prefix', { skip: skipCodex, timeout: 120000 }, async () => {
  const srv = await startServer(['--ctx', '262144']); // the test engine: a token per byte
  const home = tmpHome('codex-mcp');
  try {
    const mcpLog = path.join(home, 'mcp.log');
    const env = codexHome(home, srv.base, `
[mcp_servers.weather]
command = ${JSON.stringify(process.execPath)}
args = [${JSON.stringify(mcpScript)}]
env = { WEATHER_MCP_LOG = ${JSON.stringify(mcpLog)} }
default_tools_approval_mode = "approve"
`);
    const r = await run(process.execPath, [codexBin, ...codexArgs, 'What is the weather in Rome?'], { env, cwd: home });
    assert.equal(r.code, 0, `codex exited ${r.code}: ${r.out}${r.err}\n${srv.stderr()}`);
    const calls = mcpToolCalls(mcpLog);
    assert.equal(calls.length, 1, `the MCP tool was not called: ${r.out}${r.err}`);
    assert.equal(calls[0].params.name, 'get_weather');
    assert.deepEqual(calls[0].params.arguments, { city: 'Rome', days: 2 });
    assert.match(r.out, /The tool said: [^]*Sunny, 21 C in Rome/);
    const { reqs } = agentTurns(srv, '/v1/responses');
    const [call, answer] = reqs.slice(-2);
    assert.ok(answer.reused >= call.prompt, `the tool-result turn reused ${answer.reused} of ${answer.prompt}: ${answer.line}`);
  } finally {
    await srv.stop();
    rmSync(home, { recursive: true, force: true });
  }
});
