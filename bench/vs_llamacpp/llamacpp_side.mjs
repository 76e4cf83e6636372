// The llama.cpp side of bench/vs_llamacpp (node-llama-cpp's prebuilt CPU build).
//   speed MODEL THREADS TOKENS_JSON DECODE_N REPEATS -> JSON {prefill_tps: [...], decode_tps: [...]}
//   greedy MODEL PROMPT N [FLASH]                    -> JSON {prompt: [...], tokens: [...]}
//     FLASH: "on", "off" or "auto" (llama.cpp's default) flash attention
//   greedy-ids MODEL ID,ID,... N [FLASH]              -> the same for a prompt of token IDs, going on
//                                                        past end-of-generation tokens (as slim --ignore-eos)
import {getLlama} from "node-llama-cpp";
import {readFileSync} from "node:fs";
import {performance} from "node:perf_hooks";

const [mode, modelPath, ...args] = process.argv.slice(2);
const threads = mode === "speed" ? Number(args[0]) : 1;
const llama = await getLlama({gpu: false, build: "never", maxThreads: threads, logLevel: "error"});
const model = await llama.loadModel({modelPath, gpuLayers: 0});

if (mode === "speed") {
  const prompt = JSON.parse(readFileSync(args[1], "utf8"));
  const decodeN = Number(args[2]);
  const repeats = Number(args[3]);
  const ctx = await model.createContext({contextSize: 1024, batchSize: 512, threads: {ideal: threads, min: threads},
                                         sequences: 1});
  const seq = ctx.getSequence();
  const out = {prefill_tps: [], decode_tps: []};
  for (let r = 0; r < repeats; r++) {
    await seq.clearHistory();
    let t0 = performance.now();
    await seq.evaluateWithoutGeneratingNewTokens(prompt);
    out.prefill_tps.push(prompt.length / ((performance.now() - t0) / 1000));
    await seq.clearHistory();
    // The first generated token comes with the prefill; time the decodeN - 1 after it.
    let n = 0, tFirst = 0;
    for await (const tok of seq.evaluate(prompt, {temperature: 0})) {
      n++;
      if (n === 1) tFirst = performance.now();
      if (n >= decodeN) break;
    }
    out.decode_tps.push((decodeN - 1) / ((performance.now() - tFirst) / 1000));
  }
  console.log(JSON.stringify(out));
} else if (mode === "greedy" || mode === "greedy-ids") {
  const prompt = mode === "greedy" ? model.tokenize(args[0]) : args[0].split(",").map(Number);
  const n = Number(args[1]);
  const flash = {on: true, off: false, auto: "auto"}[args[2] ?? "auto"];
  const ctx = await model.createContext({contextSize: 512, threads: 1, sequences: 1, flashAttention: flash});
  const seq = ctx.getSequence();
  const tokens = [];
  for await (const tok of seq.evaluate(prompt, {temperature: 0, yieldEogToken: mode === "greedy-ids"})) {
    tokens.push(tok);
    if (tokens.length >= n) break;
  }
  console.log(JSON.stringify({prompt, tokens}));
}
process.exit(0);
