// sb.files through a real daemon: list, stat, mkdir, rename, remove, a directory as tar bytes
// both ways (a hostile one refused whole), and a watch.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { refused, skip, withSandbox } from './helpers.js';

// A tar with a member climbing out of its directory, made by the sandbox's own Python.
const HOSTILE = `
import io, tarfile
out = io.BytesIO()
with tarfile.open(fileobj=out, mode="w") as t:
    for name in ("fine", "../escape"):
        info = tarfile.TarInfo(name); info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
open("hostile.tar", "wb").write(out.getvalue())
`;

describe('sb.files through the daemon', { skip }, () => {
  test('list, stat, mkdir, rename, remove', () => withSandbox(async (sb) => {
    assert.equal(await sb.files.mkdir('/workspace/src/lib', { parents: true }), true);
    assert.equal(await sb.files.mkdir('src/lib', { parents: true }), false);
    await sb.write('src/lib/a.txt', 'abc');
    const [entry] = await sb.files.list('src/lib');
    assert.deepEqual([entry.name, entry.path, entry.type, entry.size, entry.mode],
      ['a.txt', 'src/lib/a.txt', 'file', 3, 0o644]);
    assert.equal((await sb.files.stat('src')).type, 'dir');
    await sb.files.rename('src/lib/a.txt', 'src/b.txt');
    assert.equal((await sb.run(['cat', 'src/b.txt'])).text, 'abc');
    await assert.rejects(sb.files.remove('src'), refused('file_exists', 409));
    await sb.files.remove('src', { recursive: true });
    assert.equal(await sb.files.exists('src'), false);
    await assert.rejects(sb.files.list('../etc'), refused('bad_path', 400));
  }));

  test('a directory as tar both ways; a hostile one refused whole', () => withSandbox(async (sb) => {
    await sb.write('proj/x.py', 'x = 1\n');
    await sb.write('proj/sub/y.py', 'y = 2\n');
    const tar = await sb.files.downloadTar('proj');
    assert.deepEqual(await sb.files.uploadTar(tar, 'copy'), { path: 'copy', size: 12, entries: 3 });
    assert.equal((await sb.run(['cat', 'copy/sub/y.py'])).text, 'y = 2\n');
    assert.ok((await sb.run(['python3', '-c', HOSTILE])).ok);
    await assert.rejects(sb.files.uploadTar(await sb.read('hostile.tar'), 'copy'),
      refused('bad_archive', 400));
    assert.equal(await sb.files.exists('copy/fine'), false); // nothing of it arrived
  }));

  test('a watch sees a file made, changed and removed', () => withSandbox(async (sb) => {
    await sb.files.mkdir('w');
    const watch = await sb.files.watch('w');
    try {
      assert.equal(watch.directories, 1);
      await sb.run(['sh', '-c', 'echo 1 > w/f && echo 2 >> w/f && rm w/f']);
      const seen = [];
      for await (const event of watch) {
        seen.push(`${event.event} ${event.path}`);
        if (event.event === 'delete') break;
      }
      // The kernel merges a modify into the one before it while neither was read.
      assert.deepEqual([...new Set(seen)], ['create w/f', 'modify w/f', 'delete w/f']);
    } finally {
      watch.close();
    }
  }));
});
