// The chat page `hesper-rs serve` answers at `/`: it talks to the server's own OpenAI API
// (streamed chat or text completions, the sampling fields, a stop that cancels the request).
// The API key, when the server asks for one, is kept in this tab's sessionStorage only.
const $ = (id) => document.getElementById(id);

let history = []; // the chat's turns, as the API takes them
let abort = null; // the request under way
let answer = null; // the element the answer streams into

function setState(state) {
  document.body.dataset.state = state;
  const busy = state === 'generating';
  $('send').disabled = busy;
  $('new-chat').disabled = busy;
  $('stop').disabled = !busy;
}

function showError(message) {
  $('error').textContent = message;
  $('error').hidden = false;
}

function clearError() {
  $('error').hidden = true;
  $('error').textContent = '';
}

function headers() {
  const h = { 'content-type': 'application/json' };
  const key = $('api-key').value.trim();
  if (key) h.authorization = `Bearer ${key}`;
  return h;
}

// The error a failed answer carries, as one line.
async function failure(res) {
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    if (body.error && body.error.message) message = body.error.message;
  } catch {
    // not JSON: the status says it
  }
  if (res.status === 401) message = `${message}: type this server's API key above`;
  return message;
}

// The model's name and context, from the server.
async function describe() {
  try {
    const res = await fetch('v1/models', { headers: headers() });
    if (!res.ok) {
      $('model').textContent = await failure(res);
      return;
    }
    const m = (await res.json()).data[0];
    const props = await (await fetch('props', { headers: headers() })).json();
    $('model').textContent = `${m.id} · ${props.model_path} · ${props.backend} · context ${props.default_generation_settings.n_ctx} · chat template: ${props.chat_template}`;
  } catch (e) {
    $('model').textContent = `The server did not answer: ${e.message}`;
  }
}

function settings() {
  const num = (id) => Number($(id).value);
  const s = {
    temperature: num('temperature'),
    top_k: num('top_k'),
    top_p: num('top_p'),
    max_tokens: num('max_tokens'),
    stream: true,
    stream_options: { include_usage: true },
  };
  if (num('seed') >= 0) s.seed = num('seed');
  return s;
}

function addTurn(role, text) {
  const div = document.createElement('div');
  div.className = `turn ${role}`;
  div.textContent = text;
  $('log').appendChild(div);
  $('log').scrollTop = $('log').scrollHeight;
  return div;
}

// Reads a server-sent event stream, calling `onData` with each event's JSON.
async function readEvents(res, onData) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') return;
        onData(JSON.parse(data));
      }
    }
  }
}

async function send() {
  const text = $('prompt').value;
  if (!text.trim()) return;
  clearError();
  const chat = $('mode').value === 'chat';
  addTurn('user', text);
  answer = addTurn('assistant', '');
  $('prompt').value = '';
  setState('generating');
  const body = settings();
  if (chat) {
    if (history.length === 0 && $('system').value.trim()) {
      history.push({ role: 'system', content: $('system').value });
    }
    history.push({ role: 'user', content: text });
    body.messages = history;
  } else {
    body.prompt = text;
  }
  abort = new AbortController();
  const started = performance.now();
  let first = null;
  let usage = null;
  let written = '';
  try {
    const res = await fetch(chat ? 'v1/chat/completions' : 'v1/completions', {
      method: 'POST',
      headers: headers(),
      body: JSON.stringify(body),
      signal: abort.signal,
    });
    if (!res.ok) throw new Error(await failure(res));
    await readEvents(res, (e) => {
      if (e.error) throw new Error(e.error.message);
      if (e.usage) usage = e.usage;
      const c = e.choices && e.choices[0];
      const piece = c && (chat ? c.delta && c.delta.content : c.text);
      if (piece) {
        first ??= performance.now();
        written += piece;
        answer.textContent = written;
        $('log').scrollTop = $('log').scrollHeight;
      }
    });
    answer.dataset.done = 'true';
  } catch (e) {
    if (e.name === 'AbortError') {
      answer.dataset.done = 'stopped';
    } else {
      showError(e.message);
      answer.dataset.done = 'failed';
    }
  } finally {
    if (chat) history.push({ role: 'assistant', content: written });
    showStats(started, first, usage, answer.dataset.done === 'stopped');
    abort = null;
    answer = null;
    setState('ready');
  }
}

function showStats(started, first, usage, stopped) {
  const now = performance.now();
  if (!usage) {
    $('stats').textContent = stopped ? 'stopped' : '';
    return;
  }
  const n = usage.completion_tokens;
  const tps = first && n > 1 && now > first ? (1000 * (n - 1)) / (now - first) : 0;
  const ttft = first ? `${(first - started).toFixed(0)} ms to the first token` : 'no token';
  $('stats').textContent = `${n} tokens, ${tps.toFixed(1)} t/s, ${ttft} (prompt: ${usage.prompt_tokens} tokens)`;
  $('stats').dataset.tokens = String(n);
}

$('api-key').value = sessionStorage.getItem('hesper-api-key') || '';
$('api-key').onchange = () => {
  sessionStorage.setItem('hesper-api-key', $('api-key').value.trim());
  describe();
};
$('send').onclick = send;
$('stop').onclick = () => abort && abort.abort();
$('new-chat').onclick = () => {
  history = [];
  $('log').textContent = '';
  $('stats').textContent = '';
  clearError();
};
$('prompt').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    if (document.body.dataset.state !== 'generating') send();
  }
});
setState('ready');
describe();
