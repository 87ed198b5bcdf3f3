// E2B's code interpreter JS/TS SDK (@e2b/code-interpreter), unchanged, against `stasis e2b serve`: its template
// code-interpreter-v1 is stasis' code-interpreter image. Driven by tests/code/test_e2b_code_interpreter.py.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const sbx = await Sandbox.create({ timeoutMs: 30 * 60 * 1000 })
after(async () => { await sbx.kill() })

test('code runs in a kernel that keeps its variables, with output streamed', async () => {
  const heard = []
  const first = await sbx.runCode('y = 6\nprint("hello")\ny * 7', { onStdout: (m) => heard.push(m.line) })
  assert.equal(first.text, '42')
  assert.deepEqual(first.logs.stdout, ['hello\n'])
  assert.deepEqual(heard, ['hello\n'])
  assert.equal((await sbx.runCode('y + 1')).text, '7')
})

test('rich results and errors come back as the SDK shapes them', async () => {
  const table = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2]})')
  assert.ok(table.results[0].html.includes('<table'))
  const plot = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])')
  assert.ok(plot.results.some((r) => r.png && Buffer.from(r.png, 'base64').subarray(0, 4).toString('latin1') === '\x89PNG'))
  const line = await sbx.runCode('fig, ax = plt.subplots()\nax.plot([1, 2], [10, 20], label="rate")\nplt.show()')
  const chart = line.results.find((r) => r.chart).chart  // E2B's chart, as its template's extractor makes it
  assert.equal(chart.type, 'line')
  assert.deepEqual(chart.elements.map((e) => [e.label, e.points]), [['rate', [[1, 10], [2, 20]]]])
  assert.deepEqual((await sbx.runCode('pd.DataFrame({"a": [1, 2]})')).results[0].data, { a: [1, 2] })
  const failed = await sbx.runCode('1 / 0')
  assert.equal(failed.error.name, 'ZeroDivisionError')
  assert.ok(failed.error.traceback.includes('ZeroDivisionError'))
})

test('contexts are kernels of their own', async () => {
  const context = await sbx.createCodeContext({ cwd: '/tmp' })
  assert.equal((await sbx.runCode('import os; os.getcwd()', { context })).text, "'/tmp'")
  assert.ok((await sbx.listCodeContexts()).some((c) => c.id === context.id))
  await sbx.removeCodeContext(context.id)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === context.id))
})
