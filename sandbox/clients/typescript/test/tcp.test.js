// A daemon over TCP with its bearer key (SEALGATE_TEST_TCP: its http://host:port, and
// SEALGATE_TEST_TCP_KEY), found as the client finds one by default: $SEALGATE_SANDBOXD and
// $SEALGATE_SANDBOXD_KEY.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Client, DEFAULT_DAEMON, Sandbox } from '@sealgate/sandbox';
import { policy, refused } from './helpers.js';

const url = process.env.SEALGATE_TEST_TCP ?? '';
const key = process.env.SEALGATE_TEST_TCP_KEY ?? '';

test('the default daemon when none is named', () => {
  const saved = process.env.SEALGATE_SANDBOXD;
  delete process.env.SEALGATE_SANDBOXD;
  try {
    assert.equal(new Client().daemon, DEFAULT_DAEMON);
    assert.equal(DEFAULT_DAEMON, '/run/sealgate/sandboxd.sock');
  } finally {
    if (saved !== undefined) process.env.SEALGATE_SANDBOXD = saved;
  }
});

test('over TCP with the bearer key from the environment', { skip: url ? false : 'no SEALGATE_TEST_TCP' },
  async () => {
    const saved = { ...process.env };
    process.env.SEALGATE_SANDBOXD = url;
    process.env.SEALGATE_SANDBOXD_KEY = key;
    try {
      const sb = await Sandbox.create(policy);
      try {
        assert.equal(sb.client.daemon, url);
        assert.equal((await sb.run(['echo', 'over tcp'])).text, 'over tcp\n');
        await sb.write('a/b.txt', 'both ways');
        assert.equal((await sb.read('a/b.txt')).toString(), 'both ways');
        assert.deepEqual((await new Client().list()).map((s) => s.id), [sb.id]);
      } finally {
        await sb.delete();
      }
      await assert.rejects(new Client({ key: `${key}x` }).list(), refused('unauthorized', 401));
      process.env.SEALGATE_SANDBOXD_KEY = '';
      await assert.rejects(new Client().list(), refused('unauthorized', 401));
    } finally {
      for (const name of ['SEALGATE_SANDBOXD', 'SEALGATE_SANDBOXD_KEY']) {
        if (saved[name] === undefined) delete process.env[name];
        else process.env[name] = saved[name];
      }
    }
  });

test('a signed URL of a port, fetched without the key', { skip: url ? false : 'no SEALGATE_TEST_TCP' },
  async () => {
    const sb = await Sandbox.create(policy, { daemon: url, key });
    try {
      await sb.write('hello.txt', 'through a signed URL\n');
      await sb.start(['python3', '-m', 'http.server', '8000', '--directory', '/workspace']);
      const signed = await sb.url(8000, { expiresIn: 60 });
      assert.ok(signed.startsWith(`${url}/v1/signed/${sb.id}.8000.`), signed);
      const deadline = Date.now() + 20_000;
      let answer = await fetch(`${signed}hello.txt`); // fetch: no Authorization at all
      while (answer.status === 502 && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 100));
        answer = await fetch(`${signed}hello.txt`);
      }
      assert.equal(answer.status, 200);
      assert.equal(await answer.text(), 'through a signed URL\n');
      const tampered = signed.replace(/\.8000\./, '.8001.');
      const refusal = await fetch(`${tampered}hello.txt`);
      assert.equal(refusal.status, 403);
      assert.equal(refusal.headers.get('x-sealgate-error'), 'bad_signature');
    } finally {
      await sb.delete();
    }
  });
