// E2B's Template build API through the official e2b JS SDK, unchanged: a template built, rebuilt from its cache
// with its last step changed, started by name:tag, and a failing step's error. Driven by tests/e2b/test_templates.py,
// which makes the build context (STASIS_TEMPLATE_CONTEXT) and its run's own template name (STASIS_TEMPLATE_NAME).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, Template, BuildError, waitForFile } from 'e2b'

const context = process.env.STASIS_TEMPLATE_CONTEXT
const name = process.env.STASIS_TEMPLATE_NAME

function template(lastStep) {
  return Template({ fileContextPath: context })
    .fromBaseImage()
    .copy('app', '/home/user/app')
    .setEnvs({ GREETING: 'from-js' })
    .setWorkdir('/home/user/app')
    .runCmd('echo $GREETING > env.txt && whoami > who.txt')
    .runCmd(lastStep)
    .setStartCmd('sleep 1 && touch /tmp/started && sleep infinity', waitForFile('/tmp/started'))
}

test('a template is built, rebuilt from its cache and started by name:tag', async () => {
  const first = []
  await Template.build(template('echo one > last.txt'), `${name}:v1`, { onBuildLogs: (e) => first.push(e.message) })
  const steps = (logs) => logs.filter((m) => m.startsWith('['))
  assert.equal(steps(first).length, 5)
  assert.ok(steps(first).every((m) => !m.includes('CACHED')), steps(first).join('\n'))

  const second = []
  await Template.build(template('echo two > last.txt'), `${name}:v2`, { onBuildLogs: (e) => second.push(e.message) })
  assert.deepEqual(steps(second).map((m) => m.includes('CACHED')), [true, true, true, true, false], steps(second).join('\n'))

  for (const [tag, last] of [['v1', 'one\n'], ['v2', 'two\n']]) {
    const sbx = await Sandbox.create(`${name}:${tag}`)
    try {
      assert.equal(await sbx.files.read('/home/user/app/last.txt'), last)
      assert.equal(await sbx.files.read('/home/user/app/env.txt'), 'from-js\n')
      assert.equal(await sbx.files.read('/home/user/app/who.txt'), 'user\n')
      assert.equal((await sbx.commands.run('test -f /tmp/started && echo started')).stdout, 'started\n')
    } finally {
      await sbx.kill()
    }
  }
  const tags = (await Template.getTags(name)).map((t) => t.tag).sort()
  assert.deepEqual(tags, ['v1', 'v2'])
})

test('a failing step is a BuildError naming why', async () => {
  const failing = Template().fromBaseImage().runCmd('echo about to fail; exit 4')
  await assert.rejects(Template.build(failing, `${name}-failing`), (e) => e instanceof BuildError && /exit code 4/.test(e.message))
})
