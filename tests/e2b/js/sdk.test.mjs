// The official e2b JS/TS SDK, unchanged, against `stasis e2b serve`: E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY come from the listener the pytest driver (tests/e2b/test_js_sdk.py) started.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, AuthenticationError, NotFoundError, TimeoutError, InvalidArgumentError } from 'e2b'

const sbx = await Sandbox.create({ timeoutMs: 30 * 60 * 1000, metadata: { suite: 'e2b-js' } })
after(async () => { await sbx.kill() })

async function waitFor(predicate, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error('condition not met in time')
    await new Promise((r) => setTimeout(r, 100))
  }
}

test('commands run as the base template user, streamed, and failures are CommandExitError', async () => {
  const result = await sbx.commands.run('whoami; pwd; echo err >&2')
  assert.equal(result.stdout, 'user\n/home/user\n')
  assert.equal(result.stderr, 'err\n')
  const lines = []
  await sbx.commands.run('echo a; echo b', { onStdout: (d) => lines.push(d) })
  assert.equal(lines.join(''), 'a\nb\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
  await assert.rejects(sbx.commands.run('exit 7'), (e) => e instanceof CommandExitError && e.exitCode === 7)
})

test('a background command is fed through stdin, listed, and killed', async () => {
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'through stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  assert.equal((await cat.wait()).stdout, 'through stdin\n')
  const sleeper = await sbx.commands.run('sleep 600', { background: true })
  assert.ok((await sbx.commands.list()).some((p) => p.pid === sleeper.pid))
  assert.equal(await sbx.commands.kill(sleeper.pid), true)
  assert.equal(await sbx.commands.kill(sleeper.pid), false)
})

test('files are written, read, listed, renamed and removed', async () => {
  const info = await sbx.files.write('js/hello.txt', 'from node')
  assert.equal(info.path, '/home/user/js/hello.txt')
  assert.equal(await sbx.files.read('js/hello.txt'), 'from node')
  const bytes = await sbx.files.read('/home/user/js/hello.txt', { format: 'bytes' })
  assert.equal(Buffer.from(bytes).toString(), 'from node')
  await sbx.files.write([{ path: '/tmp/js/a', data: 'A' }, { path: '/tmp/js/b', data: 'B' }])
  assert.deepEqual((await sbx.files.list('/tmp/js')).map((e) => e.name).sort(), ['a', 'b'])
  assert.equal(await sbx.files.exists('/tmp/js/a'), true)
  assert.equal((await sbx.files.getInfo('/tmp/js/a')).size, 1)
  assert.equal(await sbx.files.makeDir('/tmp/js/sub'), true)
  assert.equal(await sbx.files.makeDir('/tmp/js/sub'), false)
  await sbx.files.rename('/tmp/js/a', '/tmp/js/c')
  assert.equal(await sbx.files.exists('/tmp/js/a'), false)
  await sbx.files.remove('/tmp/js')
  await assert.rejects(sbx.files.read('/tmp/js/c'), (e) => e instanceof NotFoundError)
})

test('pause, then connect: a background process counts on from memory', async () => {
  const other = await Sandbox.create({ timeoutMs: 10 * 60 * 1000 })
  try {
    await other.files.write('/tmp/counter.py', 'import itertools, time\nfor i in itertools.count():\n    open("/tmp/count", "w").write(str(i))\n    time.sleep(0.2)\n')
    await other.commands.run('python3 /tmp/counter.py', { background: true })
    const count = async (s) => Number((await s.commands.run('cat /tmp/count 2>/dev/null || echo 0')).stdout.trim())
    await waitFor(async () => (await count(other)) > 0)
    const before = await count(other)
    await other.pause()
    const listed = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
    assert.ok(listed.some((s) => s.sandboxId === other.sandboxId))
    const again = await Sandbox.connect(other.sandboxId)
    await waitFor(async () => (await count(again)) > before)
    assert.ok((await count(again)) < before + 10_000)
  } finally {
    await other.kill()
  }
})

test('the listing carries metadata, and getInfo the template', async () => {
  const found = await Sandbox.list({ query: { metadata: { suite: 'e2b-js' } } }).nextItems()
  assert.deepEqual(found.map((s) => s.sandboxId), [sbx.sandboxId])
  const info = await sbx.getInfo()
  assert.equal(info.templateId, 'base')
})

test('a wrong API key is refused', async () => {
  await assert.rejects(Sandbox.create({ apiKey: 'e2b_wrong' }), (e) => e instanceof AuthenticationError)
})

test('watchDir streams the changes below a directory', async () => {
  await sbx.files.makeDir('/tmp/jswatch/deep')
  const seen = []
  const entries = []
  const watcher = await sbx.files.watchDir('/tmp/jswatch', (e) => {
    seen.push(`${e.name} ${e.type}`)
    if (e.entry) entries.push(e.entry)
  }, { recursive: true, includeEntry: true })  // envd 0.6.3's entry info
  try {
    await sbx.files.write('/tmp/jswatch/deep/f.txt', 'x')
    await waitFor(async () => seen.some((s) => s.startsWith('deep/f.txt')))
    await waitFor(async () => entries.some((e) => e.path === '/tmp/jswatch/deep/f.txt' && e.size === 1))
  } finally {
    await watcher.stop()
  }
})

test('files and commands behave as envd does: a missing path removed, a relative cwd, signed URLs', async () => {
  await sbx.files.remove('/tmp/never-was-here')  // no error, as on E2B
  await sbx.files.makeDir('/home/user/jsdir')
  assert.equal((await sbx.commands.run('pwd', { cwd: 'jsdir' })).stdout, '/home/user/jsdir\n')
  await sbx.files.write('/home/user/js-signed.txt', 'signed')
  const download = await sbx.downloadUrl('js-signed.txt', { useSignatureExpiration: 600 })
  assert.equal(await (await fetch(download)).text(), 'signed')  // no header: the signature is the credential
  const form = new FormData()
  form.append('file', new Blob(['uploaded']), 'up.txt')
  assert.ok((await fetch(await sbx.uploadUrl('/home/user/js-up.txt'), { method: 'POST', body: form })).ok)
  assert.equal(await sbx.files.read('/home/user/js-up.txt'), 'uploaded')
  assert.equal((await fetch(download.replace('js-signed', 'js-up'))).status, 401)
  await sbx.files.write('/tmp/js-gz.txt', 'zipped '.repeat(5000), { gzip: true })  // envd 0.5.7's octet-stream
  assert.equal(await sbx.files.read('/tmp/js-gz.txt'), 'zipped '.repeat(5000))
})

test('a paused sandbox is not running, the listing is newest first, and a kill under a command is said', async () => {
  const other = await Sandbox.create({ timeoutMs: 10 * 60 * 1000 })
  try {
    const newest = (await Sandbox.list({ query: {} }).nextItems()).map((s) => s.sandboxId)
    assert.ok(newest.indexOf(other.sandboxId) < newest.indexOf(sbx.sandboxId))
    await other.pause()
    assert.equal(await other.isRunning(), false)
    const again = await Sandbox.connect(other.sandboxId)
    assert.equal(await again.isRunning(), true)
    const sleeper = await again.commands.run('sleep 600', { background: true })
    setTimeout(() => { again.kill() }, 1000)
    await assert.rejects(sleeper.wait(), (e) => e instanceof TimeoutError)  // E2B's: the sandbox went away
  } finally {
    await other.kill()
  }
})

test('sudo, file metadata and a filesystem-only pause, as on E2B', async () => {
  assert.equal((await sbx.commands.run('sudo -n whoami')).stdout, 'root\n')  // gVisor: stasis' sudo, via the agent
  const labels = { Owner: 'agent' }
  if (process.env.STASIS_TEST_BACKEND === 'microvm') {  // extended attributes: a microVM's file system keeps them
    assert.deepEqual((await sbx.files.write('/tmp/js-labelled', 'x', { metadata: labels })).metadata, { owner: 'agent' })
    assert.deepEqual((await sbx.files.getInfo('/tmp/js-labelled')).metadata, { owner: 'agent' })
  } else {  // gVisor's keeps none: refused before anything is written
    await assert.rejects(sbx.files.write('/tmp/js-labelled', 'x', { metadata: labels }), (e) => e instanceof InvalidArgumentError)
    assert.equal(await sbx.files.exists('/tmp/js-labelled'), false)
  }
  const other = await Sandbox.create({ timeoutMs: 10 * 60 * 1000 })
  try {
    await other.files.write('/home/user/kept', 'on disk')
    await other.commands.run('sleep 600', { background: true })
    await other.pause({ keepMemory: false })
    const again = await Sandbox.connect(other.sandboxId)
    assert.equal(await again.files.read('/home/user/kept'), 'on disk')
    assert.equal((await again.commands.run('pgrep -x sleep || echo none')).stdout, 'none\n')  // booted again
  } finally {
    await other.kill()
  }
})
