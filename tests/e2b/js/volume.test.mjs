// E2B's Volumes through the official e2b JS SDK, unchanged: created, mounted by two sandboxes, written by one and
// read by the other and through the content API. Driven by tests/e2b/test_volumes.py (STASIS_VOLUME_NAME).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, Volume } from 'e2b'

test('a volume is shared by two sandboxes and outlives them', async () => {
  const volume = await Volume.create(process.env.STASIS_VOLUME_NAME)
  const a = await Sandbox.create({ volumeMounts: { '/data': volume } })
  const b = await Sandbox.create({ volumeMounts: { '/data': volume.name } })
  try {
    await a.commands.run('echo from-js > /data/js.txt')
    assert.equal(await b.files.read('/data/js.txt'), 'from-js\n')
  } finally {
    await a.kill()
    await b.kill()
  }
  assert.equal(await volume.readFile('/js.txt'), 'from-js\n')
  await volume.writeFile('/written.txt', 'by the content API')
  assert.deepEqual((await volume.list('/')).map((e) => e.name).sort(), ['js.txt', 'written.txt'])
  await Volume.destroy(volume.volumeId)
})
