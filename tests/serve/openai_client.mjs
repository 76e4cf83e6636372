// The official `openai` npm client against a running `slim serve`:
//   node openai_client.mjs OPENAI_MODULE_DIR BASE_URL MODEL [EXPERTS_PER_TOKEN]
// Non-streaming chat, streaming chat (must equal the non-streaming text), completions
// with stop sequences (the text must end right before the stop string), the model list
// and the client's typed errors; for a Mixture-of-Experts model (EXPERTS_PER_TOKEN given)
// the experts' work and energy in usage. Prints one line per check; exits 1 on the first failure.
import assert from "node:assert/strict";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [moduleDir, baseURL, model, expertsPerToken] = process.argv.slice(2);
const { default: OpenAI, NotFoundError, BadRequestError } = await import(
  pathToFileURL(path.join(moduleDir, "node_modules", "openai", "index.mjs")).href);
const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "not-needed", maxRetries: 0, timeout: 120000 });

const messages = [
  { role: "system", content: "You are a helpful assistant for database administrators." },
  { role: "user", content: "How do I create an index in PostgreSQL?" },
];

async function check(name, fn) {
  try {
    await fn();
    console.log("ok   " + name);
  } catch (e) {
    console.log("FAIL " + name + ": " + (e.stack || e));
    process.exit(1);
  }
}

let plain;
await check("models.list", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [model]);
});

await check("chat, not streamed", async () => {
  plain = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  assert.equal(plain.object, "chat.completion");
  assert.equal(plain.choices.length, 1);
  assert.equal(plain.choices[0].message.role, "assistant");
  assert.ok(plain.choices[0].message.content.length > 0);
  assert.ok(["stop", "length"].includes(plain.choices[0].finish_reason));
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);
});

await check("chat, streamed, same text", async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks > 2);
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
});

await check("slim_energy: energy in usage only when asked", async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, slim_energy: true });
  const e = r.usage.energy;
  assert.ok(e.prefill_joules > 0 && e.decode_joules > 0, JSON.stringify(e));
  assert.equal(e.joules, e.prefill_joules + e.decode_joules);
  assert.ok(e.source === "estimated" || e.source.startsWith("measured:"), e.source);
  assert.equal(plain.usage.energy, undefined);
});

if (expertsPerToken)
  await check("slim_energy: usage.experts of a Mixture-of-Experts model", async () => {
    const r = await client.completions.create({ model, prompt: "The cat", max_tokens: 6, temperature: 0, slim_energy: true });
    const x = r.usage.experts;
    assert.equal(x.evaluated_tokens, r.usage.prompt_tokens + r.usage.completion_tokens - 1);
    for (const layer of x.routed) assert.equal(layer.reduce((a, b) => a + b, 0), x.evaluated_tokens * Number(expertsPerToken));
    const parts = x.expert_j.reduce((a, b) => a + b, 0) + x.shared_j + x.other_j;
    assert.ok(Math.abs(parts / r.usage.energy.joules - 1) < 1e-9, JSON.stringify(x));
    assert.equal(x.energy_basis, r.usage.energy.source);
  });

await check("completions with stop sequences", async () => {
  const prompt = "The PostgreSQL server";
  const full = await client.completions.create({ model, prompt, max_tokens: 32, temperature: 0 });
  const text = full.choices[0].text;
  // A stop string from the middle of the text (3 characters, probably across tokens).
  const at = Math.floor(text.length / 2);
  const stop = text.slice(at, at + 3);
  assert.equal(stop.length, 3, "text too short: " + JSON.stringify(text));
  const cut = await client.completions.create({ model, prompt, max_tokens: 32, temperature: 0, stop: [stop, "\u0000never"] });
  assert.equal(cut.choices[0].text, text.slice(0, text.indexOf(stop)));
  assert.equal(cut.choices[0].finish_reason, "stop");
  const streamed = await client.completions.create({ model, prompt, max_tokens: 32, temperature: 0, stop, stream: true });
  let s = "";
  for await (const chunk of streamed) s += chunk.choices[0]?.text ?? "";
  assert.equal(s, cut.choices[0].text);
});

await check("typed errors", async () => {
  await assert.rejects(client.chat.completions.create({ model: "no-such-model", messages }), NotFoundError);
  await assert.rejects(client.chat.completions.create({ model, messages, temperature: 7 }), BadRequestError);
});
