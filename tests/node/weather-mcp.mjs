// weather-mcp.mjs - a minimal MCP server over stdio (JSON-RPC 2.0, one
// message a line) with one tool, get_weather, for the agent-client tests
// (agents.test.mjs): Claude Code and Codex start it, list its tool and call
// it. Every message it receives is appended to $WEATHER_MCP_LOG, so a test
// sees the call the client made.
import readline from 'node:readline';
import fs from 'node:fs';

const log = process.env.WEATHER_MCP_LOG;
const send = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const tool = {
  name: 'get_weather',
  description: 'Get the current weather for a city.',
  annotations: { readOnlyHint: true, openWorldHint: false },
  inputSchema: {
    type: 'object',
    properties: { city: { type: 'string', description: 'The city name' }, days: { type: 'integer' } },
    required: ['city'],
  },
};
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  let m;
  try { m = JSON.parse(line); } catch { return; }
  if (log) fs.appendFileSync(log, line + '\n');
  if (m.id === undefined) return; // a notification
  if (m.method === 'initialize') {
    return send({ jsonrpc: '2.0', id: m.id, result: {
      protocolVersion: m.params?.protocolVersion ?? '2025-06-18',
      capabilities: { tools: {} }, serverInfo: { name: 'weather', version: '1.0.0' } } });
  }
  if (m.method === 'tools/list') return send({ jsonrpc: '2.0', id: m.id, result: { tools: [tool] } });
  if (m.method === 'tools/call') {
    const city = m.params?.arguments?.city ?? '?';
    return send({ jsonrpc: '2.0', id: m.id, result: { content: [{ type: 'text', text: `Sunny, 21 C in ${city}` }] } });
  }
  send({ jsonrpc: '2.0', id: m.id, error: { code: -32601, message: `method not found: ${m.method}` } });
});
