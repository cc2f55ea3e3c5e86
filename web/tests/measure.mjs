// Loads one GGUF file in the page through the file picker (headless Chromium, WebGPU on
// SwiftShader) and prints what BENCHMARKS.md records: load time, wasm memory after the load
// (linear memory only grows, so this is the peak), and greedy decode speed (for a file with
// no tokenizer, the time of a one-token forward pass).
//   node web/tests/measure.mjs MODEL.gguf [TOKENS]
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startPage } from './harness.mjs';

const [model, tokens = '8'] = process.argv.slice(2);
if (!model) {
  console.error('usage: node web/tests/measure.mjs MODEL.gguf [TOKENS]');
  process.exit(2);
}
const scratch = mkdtempSync(join(tmpdir(), 'hesper-measure-'));
const { base, browser, close } = await startPage({}, join(scratch, 'profile'));
const page = await browser.newPage();
await page.goto(base, { waitUntil: 'load' });
await page.waitForFunction(() => document.body.dataset.state === 'empty', { timeout: 60_000 });
const loaded = page.evaluate(() => new Promise((resolve, reject) => {
  window.addEventListener('hesper', (e) => {
    if (e.detail.type === 'loaded') resolve(e.detail.info);
    if (e.detail.type === 'error') reject(new Error(e.detail.message));
  });
}));
await (await page.$('#file')).uploadFile(model);
const info = await loaded;
const mib = (b) => (b / 1048576).toFixed(1);
const figures = {
  model,
  file_mib: mib(statSync(model).size),
  load_s: (info.load_ms / 1000).toFixed(1),
  wasm_memory_after_load_mib: mib(info.wasm_memory),
};
console.log(JSON.stringify(figures));
try {
  const r = await page.evaluate((n) => window.hesper.request(
    { type: 'complete', prompt: 'Once upon a time', settings: { temperature: 0, n_predict: n } }, 'done'), Number(tokens));
  Object.assign(figures, {
    prompt_tokens: r.result.prompt_tokens,
    pp_tps: ((1000 * r.result.prompt_tokens) / r.result.prompt_ms).toFixed(2),
    gen_tokens: r.result.gen_tokens,
    tg_tps: ((1000 * r.result.gen_tokens) / r.result.gen_ms).toFixed(2),
    wasm_memory_after_generation_mib: mib(r.result.wasm_memory),
  });
} catch (e) {
  // A file without a tokenizer (the synthetic benchmark models): time one-token forward
  // passes instead (each at position 0, all logits read back).
  const ms = await page.evaluate(async (n) => {
    const t0 = performance.now();
    for (let i = 0; i < n; i++) await window.hesper.request({ type: 'logits', tokens: [1] }, 'logits');
    return (performance.now() - t0) / n;
  }, Number(tokens));
  figures.one_token_forward_s = (ms / 1000).toFixed(2);
}
console.log(JSON.stringify(figures));
await close();
rmSync(scratch, { recursive: true, force: true });
