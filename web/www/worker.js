// The engine's thread: every model call runs here, so the page never freezes. Messages in:
// load (url | file | cache), chat, complete, stop, reset, logits, cache-list, cache-clear.
// Messages out: progress, loaded, text, done, logits, cache, error. Models loaded from a URL
// or a picked file are kept in the Origin Private File System, so a reload reads them from
// there.
import init, { Engine, wasm_memory } from './pkg/hesper_web.js';

let engine = null;
let adapterName = '';
let busy = false;
let stopRequested = false;

const post = (msg) => self.postMessage(msg);
const progress = (phase) => (done, total) => post({ type: 'progress', phase, done, total });

async function cacheDir() {
  return navigator.storage.getDirectory();
}

async function cacheList() {
  const entries = [];
  try {
    for await (const [name, handle] of (await cacheDir()).entries()) {
      if (handle.kind === 'file') entries.push({ name, size: (await handle.getFile()).size });
    }
  } catch (e) {
    // No OPFS (e.g. a private window): nothing cached, loads still work.
  }
  return entries;
}

async function cacheRemove(name) {
  try {
    await (await cacheDir()).removeEntry(name);
  } catch (e) {
    // Already gone.
  }
}

// Streams a same-origin URL into the cache and returns the cached File.
async function download(url, name) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status} ${response.statusText}`);
  const total = Number(response.headers.get('content-length')) || 0;
  const handle = await (await cacheDir()).getFileHandle(name, { create: true });
  const writable = await handle.createWritable();
  const reader = response.body.getReader();
  let done = 0;
  try {
    for (;;) {
      const chunk = await reader.read();
      if (chunk.done) break;
      await writable.write(chunk.value);
      done += chunk.value.length;
      post({ type: 'progress', phase: 'download', done, total });
    }
    await writable.close();
  } catch (e) {
    await writable.abort().catch(() => {});
    await cacheRemove(name);
    throw e;
  }
  return handle.getFile();
}

async function cacheFile(name, file) {
  const handle = await (await cacheDir()).getFileHandle(name, { create: true });
  const writable = await handle.createWritable();
  await file.stream().pipeTo(writable);
}

async function cached(name) {
  const handle = await (await cacheDir()).getFileHandle(name);
  return handle.getFile();
}

async function load(msg) {
  let blob;
  let name;
  let fromCache = false;
  if (msg.source === 'url') {
    name = decodeURIComponent(new URL(msg.url, self.location.href).pathname.split('/').pop()) || 'model.gguf';
    const have = (await cacheList()).find((e) => e.name === name);
    if (have && !msg.refresh) {
      blob = await cached(name);
      fromCache = true;
    } else {
      blob = await download(msg.url, name);
    }
  } else if (msg.source === 'cache') {
    name = msg.name;
    blob = await cached(name);
    fromCache = true;
  } else {
    name = msg.file.name;
    blob = msg.file;
  }
  const t0 = performance.now();
  let info;
  try {
    info = await engine.load(blob, name, msg.options || {}, progress('load'));
  } catch (e) {
    // A file that does not load is not kept.
    if (msg.source === 'url' && !fromCache) await cacheRemove(name);
    throw e;
  }
  const loadMs = performance.now() - t0;
  if (msg.source === 'file') {
    // Kept for the next visit once it is known to load; a full disk only costs the cache.
    await cacheFile(name, msg.file).catch((e) => post({ type: 'note', text: `not cached: ${e.message}` }));
  }
  post({ type: 'loaded', info: { ...info, adapter_name: adapterName, load_ms: loadMs, from_cache: fromCache, wasm_memory: wasm_memory() } });
  post({ type: 'cache', entries: await cacheList() });
}

async function generate(msg) {
  stopRequested = false;
  const onText = (text) => {
    post({ type: 'text', text });
    return !stopRequested;
  };
  const result = msg.type === 'chat'
    ? await engine.chat(msg.message, msg.settings, onText)
    : await engine.complete(msg.prompt, msg.settings, onText);
  post({ type: 'done', result: { ...result, wasm_memory: wasm_memory() } });
}

async function handle(msg) {
  switch (msg.type) {
    case 'load': return load(msg);
    case 'chat':
    case 'complete': return generate(msg);
    case 'reset':
      engine.reset(msg.system || undefined);
      return post({ type: 'done', result: null });
    case 'logits': {
      const data = await engine.logits(Uint32Array.from(msg.tokens));
      return post({ type: 'logits', data }, [data.buffer]);
    }
    case 'tokenize':
      return post({ type: 'tokens', tokens: Array.from(engine.tokenize(msg.text)) });
    case 'cache-list':
      return post({ type: 'cache', entries: await cacheList() });
    case 'cache-clear':
      for (const e of await cacheList()) await cacheRemove(e.name);
      return post({ type: 'cache', entries: await cacheList() });
    default:
      throw new Error(`unknown message ${msg.type}`);
  }
}

const queue = [];

async function drain() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    const msg = queue.shift();
    try {
      await handle(msg);
    } catch (e) {
      post({ type: 'error', message: e && e.message ? e.message : String(e), request: msg.type });
    }
  }
  busy = false;
}

self.onmessage = (event) => {
  const msg = event.data;
  // A stop must get through while a generation runs; everything else waits its turn.
  if (msg.type === 'stop') {
    stopRequested = true;
    return;
  }
  queue.push(msg);
  drain();
};

// The adapter as the browser names it (wgpu's web backend leaves the name empty), with the
// limits and features that decide which kernels run.
async function describeAdapter() {
  const adapter = navigator.gpu && (await navigator.gpu.requestAdapter());
  if (!adapter) return '';
  const i = adapter.info || {};
  const name = [i.vendor, i.architecture, i.device, i.description].filter(Boolean).join(' ') || 'unnamed adapter';
  const l = adapter.limits;
  const mib = (n) => `${Math.floor(n / 1048576)} MiB`;
  const has = (f) => (adapter.features.has(f) ? 'yes' : 'no');
  return `${name} · storage binding ${mib(l.maxStorageBufferBindingSize)}, buffer ${mib(l.maxBufferSize)}, `
    + `${l.maxComputeInvocationsPerWorkgroup} invocations per workgroup · shader-f16: ${has('shader-f16')} · `
    + `subgroups: ${has('subgroups')} (wgpu's web backend does not pass them on)`;
}

init()
  .then(async () => {
    engine = new Engine();
    adapterName = await describeAdapter().catch(() => '');
    post({ type: 'ready', webgpu: !!navigator.gpu, adapter: adapterName });
  })
  .catch((e) => post({ type: 'error', message: `cannot start the engine: ${e.message || e}`, request: 'init' }));
