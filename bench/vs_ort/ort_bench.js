// ONNX Runtime side of bench/vs_ort: one model, fixed inputs (raw little-endian files
// written by run.py), the given intra-op thread count. Prints nothing; writes the
// outputs as raw files and the timings as JSON so run.py compares like with like.
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

async function main() {
  // optimization: ORT's graph optimization level ('all' by default; 'disabled' runs the
  // graph's own ops, e.g. a QDQ model's QuantizeLinear/DequantizeLinear as written).
  const [model, specPath, threads, warmup, iters, outDir, spin, optimization] = process.argv.slice(2);
  const spec = JSON.parse(fs.readFileSync(specPath, 'utf8'));
  const feeds = {};
  for (const inp of spec.inputs) {
    const buf = fs.readFileSync(inp.file);
    const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
    const data = inp.dtype === 'float32' ? new Float32Array(ab)
      : inp.dtype === 'int32' ? new Int32Array(ab) : new BigInt64Array(ab);
    feeds[inp.name] = new ort.Tensor(inp.dtype, data, inp.shape);
  }
  const ms = (a, b) => Number(b - a) / 1e6;
  // Cold start: session creation (load, optimize, plan) plus the first run.
  const t0 = process.hrtime.bigint();
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: Number(threads),
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: optimization || 'all',
    // run.py --no-spin: idle intra-op threads sleep instead of spinning.
    ...(spin === '0' ? { extra: { session: { intra_op: { allow_spinning: '0' } } } } : {}),
  });
  const t1 = process.hrtime.bigint();
  let out = await session.run(feeds);
  const t2 = process.hrtime.bigint();
  for (let i = 0; i < Number(warmup); ++i) out = await session.run(feeds);
  const runs = [];
  for (let i = 0; i < Number(iters); ++i) {
    const a = process.hrtime.bigint();
    out = await session.run(feeds);
    runs.push(ms(a, process.hrtime.bigint()));
  }
  fs.mkdirSync(outDir, { recursive: true });
  const outputs = [];
  for (const name of session.outputNames) {
    const t = out[name];
    const file = path.join(outDir, name.replace(/[^A-Za-z0-9_.-]/g, '_') + '.bin');
    fs.writeFileSync(file, Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    outputs.push({ name, file, dims: t.dims, type: t.type });
  }
  fs.writeFileSync(path.join(outDir, 'result.json'), JSON.stringify({
    create_ms: ms(t0, t1), first_run_ms: ms(t1, t2), cold_start_ms: ms(t0, t2), runs_ms: runs,
    outputs, version: ort.env.versions.common,
  }));
}

main().catch((e) => {
  console.error('ort_bench:', e && e.message ? e.message : e);
  process.exit(1);
});
