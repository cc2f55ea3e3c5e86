// The page: controls and the conversation. All model work happens in worker.js; this thread
// only sends requests and shows what comes back, so it never blocks.
const $ = (id) => document.getElementById(id);
const worker = new Worker('worker.js', { type: 'module' });

let modelLoaded = false;
let answer = null; // the element the current answer streams into

function setState(state) {
  document.body.dataset.state = state;
  const ready = state === 'ready';
  const idle = state === 'ready' || state === 'empty';
  for (const id of ['load-demo', 'load-url', 'file', 'cache-clear']) $(id).disabled = !idle;
  for (const id of ['send', 'new-chat', 'prompt']) $(id).disabled = !ready;
  $('stop').disabled = state !== 'generating';
  for (const b of document.querySelectorAll('#cache-list button')) b.disabled = !idle;
}

function showError(message) {
  $('error').textContent = message;
  $('error').hidden = false;
}

function clearError() {
  $('error').hidden = true;
  $('error').textContent = '';
}

const mib = (n) => `${(n / 1048576).toFixed(1)} MiB`;

function showProgress(phase, done, total) {
  const bar = $('progress');
  bar.hidden = false;
  bar.value = total ? done / total : 0;
  const verb = phase === 'download' ? 'Downloading' : 'Reading and uploading';
  const pct = total ? Math.floor((100 * done) / total) : 0;
  $('progress-label').textContent = `${verb}: ${mib(done)}${total ? ` of ${mib(total)} (${pct} %)` : ''}`;
  $('progress-label').dataset.percent = String(pct);
}

function showCache(entries) {
  const list = $('cache-list');
  list.textContent = entries.length ? 'Cached models: ' : 'Cached models: none';
  for (const e of entries) {
    const b = document.createElement('button');
    b.textContent = `${e.name} (${mib(e.size)})`;
    b.className = 'cached';
    b.onclick = () => requestLoad({ source: 'cache', name: e.name });
    list.appendChild(b);
  }
  setState(document.body.dataset.state);
}

function settings() {
  const num = (id) => Number($(id).value);
  return {
    temperature: num('temperature'),
    top_k: num('top_k'),
    top_p: num('top_p'),
    seed: num('seed'),
    n_predict: num('n_predict'),
  };
}

function requestLoad(msg) {
  clearError();
  setState('loading');
  $('model-info').textContent = '';
  worker.postMessage({ type: 'load', options: { ctx: Number($('ctx').value) }, ...msg });
}

function addTurn(role, text) {
  const div = document.createElement('div');
  div.className = `turn ${role}`;
  div.textContent = text;
  $('log').appendChild(div);
  $('log').scrollTop = $('log').scrollHeight;
  return div;
}

function send() {
  const text = $('prompt').value;
  if (!text.trim()) return;
  clearError();
  const mode = $('mode').value;
  addTurn('user', text);
  answer = addTurn('assistant', '');
  $('prompt').value = '';
  setState('generating');
  if (mode === 'chat') worker.postMessage({ type: 'chat', message: text, settings: settings() });
  else worker.postMessage({ type: 'complete', prompt: text, settings: settings() });
}

worker.onmessage = (event) => {
  const m = event.data;
  switch (m.type) {
    case 'ready':
      if (!m.webgpu) {
        $('adapter').textContent = 'This browser has no WebGPU (navigator.gpu is missing); hesper-rs needs it.';
        showError('WebGPU is not available in this browser.');
        return;
      }
      $('adapter').textContent = `Engine ready${m.adapter ? ` on ${m.adapter}` : ''}; load a model.`;
      setState('empty');
      worker.postMessage({ type: 'cache-list' });
      break;
    case 'progress':
      showProgress(m.phase, m.done, m.total);
      break;
    case 'loaded': {
      modelLoaded = true;
      const i = m.info;
      $('adapter').textContent = `${i.adapter_name} · kernels: ${i.kernels}`;
      $('adapter').title = i.adapter;
      $('model-info').textContent = `${i.model}${i.name ? ` — ${i.name}` : ''}: ${i.n_layer} layers, ${i.n_embd} wide, ${i.n_vocab} tokens, context ${i.n_ctx}; loaded in ${(i.load_ms / 1000).toFixed(2)} s${i.from_cache ? ' from the cache' : ''}; wasm memory ${mib(i.wasm_memory)}`;
      // A model that names no chat format starts in completion mode (its chat is plain text).
      $('mode').value = i.chat_template ? 'chat' : 'complete';
      $('log').textContent = '';
      setState('ready');
      break;
    }
    case 'text':
      if (answer) {
        answer.textContent += m.text;
        $('log').scrollTop = $('log').scrollHeight;
      }
      break;
    case 'done': {
      const r = m.result;
      if (r) {
        const tps = r.gen_ms > 0 ? (1000 * r.gen_tokens) / r.gen_ms : 0;
        const pps = r.prompt_ms > 0 ? (1000 * r.prompt_tokens) / r.prompt_ms : 0;
        $('stats').textContent = `${r.gen_tokens} tokens, ${tps.toFixed(1)} t/s (prompt: ${r.prompt_tokens} tokens, ${pps.toFixed(1)} t/s)${r.stopped ? ', stopped' : ''}`;
        $('stats').dataset.tokens = String(r.gen_tokens);
      }
      answer = null;
      setState(modelLoaded ? 'ready' : 'empty');
      break;
    }
    case 'cache':
      showCache(m.entries);
      break;
    case 'note':
      $('progress-label').textContent = m.text;
      break;
    case 'error':
      showError(m.message);
      answer = null;
      setState(modelLoaded ? 'ready' : (m.request === 'init' ? 'failed' : 'empty'));
      break;
    default:
      break;
  }
  window.dispatchEvent(new CustomEvent('hesper', { detail: m }));
};

$('load-demo').onclick = () => requestLoad({ source: 'url', url: 'models/hesper-kjv.gguf' });
$('load-url').onclick = () => {
  const url = $('url').value.trim();
  if (url) requestLoad({ source: 'url', url, refresh: true });
};
$('file').onchange = () => {
  const file = $('file').files[0];
  if (file) requestLoad({ source: 'file', file });
  $('file').value = '';
};
$('cache-clear').onclick = () => worker.postMessage({ type: 'cache-clear' });
$('send').onclick = send;
$('stop').onclick = () => worker.postMessage({ type: 'stop' });
$('new-chat').onclick = () => {
  $('log').textContent = '';
  setState('generating');
  worker.postMessage({ type: 'reset', system: $('system').value });
};
$('prompt').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    send();
  }
});

// For scripts and tests: one request to the worker, answered by its next reply of `type`.
window.hesper = {
  request(msg, type) {
    return new Promise((resolve, reject) => {
      const on = (e) => {
        const m = e.detail;
        if (m.type === type || m.type === 'error') {
          window.removeEventListener('hesper', on);
          if (m.type === 'error') reject(new Error(m.message));
          else resolve(m);
        }
      };
      window.addEventListener('hesper', on);
      worker.postMessage(msg);
    });
  },
};
