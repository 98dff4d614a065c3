// A session through a real daemon: create, files, commands, their ends, changes and refusals.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { describe, test } from 'node:test';
import { Client, CommandFailed, DaemonError, Sandbox } from '@sealgate/sandbox';
import { all, daemon, other, policy, refused, skip, text, withSandbox } from './helpers.js';

describe('a session through the daemon', { skip }, () => {
  test('create, write, run, stream, read and delete', async () => {
    const sb = await Sandbox.create(policy, { daemon, env: { STAGE: 'one' }, ttl: 300 });
    try {
      assert.match(sb.id, /^sb-/);
      const app = "import os\nprint('stage', os.environ['STAGE'])\n";
      assert.equal(await sb.write('src/app.py', app), 46);
      const first = await sb.run(['python3', 'src/app.py']);
      assert.equal(first.exitCode, 0);
      assert.deepEqual(first.stdout, Buffer.from('stage one\n'));
      assert.ok(first.ok && first.ending === 'exit' && first.durationMs > 0);
      const two = await sb.run(['python3', 'src/app.py'], { env: { STAGE: 'two' } });
      assert.equal(two.text, 'stage two\n');
      const bytes = Buffer.from([0, 1, 2, 255].flatMap((b) => Array(1000).fill(b)));
      assert.ok((await sb.run(['sh', '-c', 'cat > out.bin'], { stdin: bytes })).ok);
      assert.deepEqual(await sb.read('out.bin'), bytes);
      await sb.write('bin/hi.sh', '#!/bin/sh\necho hi from "$PWD"\n', { mode: 0o755 });
      assert.equal((await sb.run(['./hi.sh'], { cwd: '/workspace/bin' })).text,
        'hi from /workspace/bin\n');
      const events = await all(sb.stream(['sh', '-c', 'echo a; echo b >&2; exit 3']));
      assert.equal(text(events), 'a\n');
      assert.equal(text(events, 'stderr'), 'b\n');
      const last = events.at(-1);
      assert.ok(last?.kind === 'exit' && last.data.exitCode === 3, JSON.stringify(last));
    } finally {
      await sb.delete();
    }
    await assert.rejects(sb.run(['true']), refused('sandbox_ended', 410));
    await sb.delete(); // one already gone is fine
  });

  test('how commands end: non-zero, check, timed out, not found', () => withSandbox(async (sb) => {
    const failed = await sb.run(['sh', '-c', 'echo out; echo err >&2; exit 7']);
    assert.equal(failed.exitCode, 7);
    assert.equal(failed.ok, false);
    assert.deepEqual([failed.text, failed.stderr.toString()], ['out\n', 'err\n']);
    await assert.rejects(sb.run(['false'], { check: true }),
      (err) => err instanceof CommandFailed && err.result.exitCode === 1);
    const timed = await sb.run(['sleep', '30'], { timeout: 0.5 });
    assert.deepEqual([timed.exitCode, timed.ending], [124, 'timed_out']);
    const missing = await sb.run(['no-such-command-here']);
    assert.equal(missing.exitCode, 127);
  }));

  const label = randomUUID();
  test('update its ttl and labels; list by labels; health', () => withSandbox(async (sb) => {
    assert.equal(sb.info.metadata.suite, label);
    const updated = await sb.update({ ttl: 600, metadata: { suite: label, stage: 'two' } });
    assert.ok(updated.expires_in > 590, JSON.stringify(updated));
    assert.deepEqual(updated.metadata, { suite: label, stage: 'two' });
    const client = new Client({ daemon });
    const found = await client.list({ metadata: { suite: label, stage: 'two' } });
    assert.deepEqual(found.map((s) => s.id), [sb.id]);
    assert.deepEqual(await client.list({ metadata: { suite: label, stage: 'one' } }), []);
    assert.ok((await client.list()).some((s) => s.id === sb.id));
    await assert.rejects(sb.update({}), TypeError);
    await assert.rejects(sb.update({ sandbox: 'no-such-bot' }), refused('unknown_sandbox', 404));
    if (other) assert.equal((await sb.update({ sandbox: other })).sandbox, other);
    assert.equal((await client.health()).ready, true);
  }, { metadata: { suite: label } }));

  test('a create retried with its idempotency key gets the same sandbox', async () => {
    const idempotencyKey = `ts-${randomUUID()}`;
    const first = await Sandbox.create(policy, { daemon, idempotencyKey, ttl: 120 });
    try {
      const again = await Sandbox.create(policy, { daemon, idempotencyKey, ttl: 120 });
      assert.equal(again.id, first.id);
      const found = await Sandbox.connect(first.id, { daemon });
      assert.equal(found.id, first.id);
      assert.equal((await found.run(['echo', 'found'])).text, 'found\n');
      await assert.rejects(Sandbox.create(policy, { daemon, idempotencyKey, ttl: 60 }),
        refused('bad_request', 400)); // the same key, another body
    } finally {
      await first.delete();
    }
  });

  test('refusals: an unknown sandbox id, fork, a snapshot without an image, paused', async () => {
    await assert.rejects(Sandbox.create('no-such-bot', { daemon }), (err) => {
      assert.ok(err instanceof DaemonError, String(err));
      assert.deepEqual([err.reason, err.status, err.code], ['unknown_sandbox', 404, 'unknown_sandbox']);
      assert.match(err.message, /^unknown_sandbox: /);
      return true;
    });
    await withSandbox(async (sb) => {
      await assert.rejects(sb.fork(2), refused('unsupported', 501));
      await assert.rejects(sb.snapshot('nothing'), refused('bad_request', 400));
      await assert.rejects(sb.read('no/such/file'), refused('no_such_file', 404));
      await assert.rejects(sb.write('../escape', 'x'), refused('bad_path', 400));
      await sb.pause();
      assert.equal(sb.info.paused, true);
      await assert.rejects(sb.run(['true']), refused('sandbox_paused', 409));
      await sb.resume();
      assert.equal((await sb.run(['echo', 'thawed'])).text, 'thawed\n');
    });
    await assert.rejects(Sandbox.connect('sb-never-was', { daemon }), refused('no_such_sandbox', 404));
    const ghost = new Sandbox(new Client({ daemon }), { id: 'sb-never-was' });
    await assert.rejects(ghost.refresh(), refused('no_such_sandbox', 404));
    const nowhere = new Client({ daemon: '/nonexistent/sandboxd.sock' });
    await assert.rejects(nowhere.health(), refused('at_capacity', 0));
  });

  test('callTimeout ends the call, not the sandbox', () => withSandbox(async (sb) => {
    let began = Date.now();
    await assert.rejects(sb.run(['sleep', '30'], { callTimeout: 0.5 }), (err) => {
      assert.ok(err instanceof DaemonError);
      assert.deepEqual([err.reason, err.status], ['client_timeout', 0]);
      return true;
    });
    assert.ok(Date.now() - began < 5000);
    // Timed out while its answer is read: what came before is seen, then the error.
    began = Date.now();
    /** @type {string[]} */
    const seen = [];
    await assert.rejects(async () => {
      for await (const event of sb.stream(['sh', '-c', 'echo first; sleep 30'], { callTimeout: 1.5 })) {
        seen.push(event.kind);
      }
    }, refused('client_timeout', 0));
    assert.deepEqual(seen, ['stdout']);
    assert.ok(Date.now() - began < 6000);
    // A loop left early ends its call too.
    for await (const event of sb.stream(['sh', '-c', 'echo first; sleep 30'])) {
      assert.equal(event.kind, 'stdout');
      break;
    }
    // The commands whose callers left are killed: the sandbox runs nothing and serves on.
    const deadline = Date.now() + 10_000;
    while ((await sb.refresh()).running > 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(sb.info.running, 0);
    assert.equal((await sb.run(['echo', 'still here'], { callTimeout: 30 })).text, 'still here\n');
  }));
});
