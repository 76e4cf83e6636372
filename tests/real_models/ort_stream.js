// ONNX Runtime side of a streaming model in tests/real_models (a VAD): one session, the
// audio fed chunk by chunk, each step's state outputs fed back as the next step's state
// inputs, as an application runs it. Writes the probability output of every step as JSON.
// Usage: node ort_stream.js MODEL SPEC.json OUT.json
//   SPEC: {threads, chunks: {name, file, shape: [steps, len]},
//          fixed: [{name, file, dtype, shape}], state: [{input, output, file, shape}],
//          prob: NAME}; files hold raw little-endian float32 (int64 for dtype int64).
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

function tensor(file, dtype, shape) {
  const buf = fs.readFileSync(file);
  const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
  return new ort.Tensor(dtype, dtype === 'int64' ? new BigInt64Array(ab) : new Float32Array(ab), shape);
}

async function main() {
  const [model, specPath, outPath] = process.argv.slice(2);
  const spec = JSON.parse(fs.readFileSync(specPath, 'utf8'));
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: spec.threads, interOpNumThreads: 1, graphOptimizationLevel: 'all',
  });
  const feeds = {};
  for (const f of spec.fixed) feeds[f.name] = tensor(f.file, f.dtype, f.shape);
  for (const s of spec.state) feeds[s.input] = tensor(s.file, 'float32', s.shape);
  const all = tensor(spec.chunks.file, 'float32', spec.chunks.shape).data;
  const [steps, len] = spec.chunks.shape;
  const probs = [];
  for (let i = 0; i < steps; ++i) {
    feeds[spec.chunks.name] = new ort.Tensor('float32', all.slice(i * len, (i + 1) * len), [1, len]);
    const out = await session.run(feeds);
    probs.push(Number(out[spec.prob].data[0]));
    for (const s of spec.state) feeds[s.input] = out[s.output];
  }
  fs.writeFileSync(outPath, JSON.stringify({ probs }));
}

main().catch((e) => {
  console.error('ort_stream:', e && e.message ? e.message : e);
  process.exit(1);
});
