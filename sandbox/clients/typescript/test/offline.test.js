// The client against a stand-in daemon of node:http over TCP (no root, no sandbox): the bearer
// key, the bodies it sends, how refusals, answers it cannot read, time-outs and a daemon that
// is not there are said.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';
import { Client, Sandbox } from '@sealgate/sandbox';
import { all, refused } from './helpers.js';

/** @type {{method?: string, url?: string, headers: http.IncomingHttpHeaders, body: string}[]} */
const seen = [];
const server = http.createServer(async (req, res) => {
  let body = '';
  for await (const chunk of req) body += chunk;
  seen.push({ method: req.method, url: req.url, headers: req.headers, body });
  const json = (/** @type {number} */ status, /** @type {unknown} */ value) => {
    res.writeHead(status, { 'Content-Type': 'application/json' }).end(JSON.stringify(value));
  };
  if (req.headers.authorization !== 'Bearer a-key-of-some-length') {
    json(401, { error: 'unauthorized', detail: 'no key' });
  } else if (req.url === '/v1/sandboxes' && req.method === 'POST') {
    json(201, { id: 'sb-1', ...JSON.parse(body) });
  } else if (req.url?.startsWith('/v1/sandboxes?')) {
    json(200, { sandboxes: [] });
  } else if (req.url === '/v1/sandboxes/sb-1/exec') {
    res.writeHead(200, { 'Content-Type': 'application/x-ndjson' });
    res.write('{"stdout": "aGVsbG8K"}\n'); // and then nothing: the call's limit ends it
  } else if (req.url === '/v1/sandboxes/sb-1/hang') {
    // never answered
  } else if (req.url === '/v1/health') {
    json(503, { error: 'at_capacity', detail: 'starting' });
  } else if (req.url === '/v1/sandboxes/sb-1/pause') {
    res.writeHead(500).end('not json at all');
  } else {
    json(404, { error: 'no_such_sandbox', detail: req.url });
  }
});
let url = '';

before(async () => {
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(null)));
  url = `http://127.0.0.1:${/** @type {import('node:net').AddressInfo} */ (server.address()).port}`;
});
after(() => {
  server.closeAllConnections();
  server.close();
});

test('the key, the bodies and the labels as the daemon reads them', async () => {
  const sb = await Sandbox.create('ci-bot', {
    daemon: url, key: 'a-key-of-some-length', idleTimeout: 30, ttl: 60, idempotencyKey: 'k-1',
    limits: { memory: '1G' }, metadata: { pr: '12 34' },
  });
  const made = seen.at(-1);
  assert.deepEqual(JSON.parse(made?.body ?? ''), {
    sandbox: 'ci-bot', idle_timeout: 30, ttl: 60, limits: { memory: '1G' }, metadata: { pr: '12 34' },
  });
  assert.equal(made?.headers['idempotency-key'], 'k-1');
  assert.equal(made?.headers['content-length'], String(made?.body.length));
  await sb.client.list({ metadata: { pr: '12 34', 'a/b': 'x' } });
  assert.equal(seen.at(-1)?.url, '/v1/sandboxes?metadata.pr=12+34&metadata.a%2Fb=x');
  await assert.rejects(new Sandbox(sb.client, { id: 'sb-2' }).read('a dir/f'),
    refused('no_such_sandbox', 404));
  assert.equal(seen.at(-1)?.url, '/v1/sandboxes/sb-2/files/a%20dir/f');
  await assert.rejects(new Client({ daemon: url, key: 'wrong' }).list(), refused('unauthorized', 401));
});

test('refusals, answers it cannot read, a daemon not ready', async () => {
  const client = new Client({ daemon: url, key: 'a-key-of-some-length' });
  const sb = new Sandbox(client, { id: 'sb-1' });
  await assert.rejects(sb.pause(), refused('internal_error', 500));
  assert.equal(seen.at(-1)?.headers['content-length'], '0'); // a POST without a body says so
  assert.deepEqual(await client.health(), { ready: false, problem: 'at_capacity: starting' });
});

test('callTimeout: before the answer and while it is read', async () => {
  const client = new Client({ daemon: url, key: 'a-key-of-some-length' });
  const sb = new Sandbox(client, { id: 'sb-1' });
  await assert.rejects(client.call('GET', '/v1/sandboxes/sb-1/hang', undefined, { callTimeout: 0.2 }),
    refused('client_timeout', 0));
  /** @type {string[]} */
  const kinds = [];
  await assert.rejects(async () => {
    for await (const event of sb.stream(['echo', 'hello'], { callTimeout: 0.3 })) kinds.push(event.kind);
  }, refused('client_timeout', 0));
  assert.deepEqual(kinds, ['stdout']);
  await assert.rejects(all(sb.stream(['echo'], { callTimeout: 0.3 })), refused('client_timeout', 0));
});

test('a daemon that is not there', async () => {
  const nowhere = new Client({ daemon: 'http://127.0.0.1:9', timeout: 5 });
  await assert.rejects(nowhere.list(), refused('at_capacity', 0));
  await assert.rejects(new Client({ daemon: '/nonexistent/sock' }).list(), refused('at_capacity', 0));
});
