// What the browser tests and measurements share: a static server for the page (web/www) with
// extra folders mounted, and Debian's headless Chromium with WebGPU (SwiftShader) on (also
// for the chat page `hesper-rs serve` answers at `/`, webui.test.mjs).
import { createReadStream, statSync } from 'node:fs';
import { createServer } from 'node:http';
import { dirname, extname, join, normalize, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import puppeteer from 'puppeteer-core';

const www = resolve(dirname(fileURLToPath(import.meta.url)), '../www');
const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.wasm': 'application/wasm', '.json': 'application/json' };

/// Serves web/www at / and each `mounts` folder at its prefix (e.g. `{'/golden/': dir}`) on
/// 127.0.0.1, and starts Chromium with a fresh profile in `profileDir`.
export async function startPage(mounts, profileDir) {
  const routes = [...Object.entries(mounts), ['/', www]];
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    const [prefix, dir] = routes.find(([p]) => path.startsWith(p));
    const file = normalize(join(dir, path.slice(prefix.length) || 'index.html'));
    let size;
    try {
      if (!file.startsWith(dir)) throw new Error('outside the folder');
      size = statSync(file).size;
    } catch {
      res.writeHead(404).end('not found');
      return;
    }
    res.writeHead(200, { 'content-type': types[extname(file)] || 'application/octet-stream', 'content-length': size });
    createReadStream(file).pipe(res);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const browser = await launchBrowser(profileDir);
  return {
    base: `http://127.0.0.1:${server.address().port}/`,
    browser,
    close: async () => {
      await browser.close();
      server.close();
    },
  };
}

/// Debian's headless Chromium with WebGPU (SwiftShader) on and a fresh profile in `profileDir`.
export function launchBrowser(profileDir) {
  return puppeteer.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    userDataDir: profileDir,
    protocolTimeout: 1_800_000,
    args: ['--enable-unsafe-webgpu', '--no-sandbox', '--disable-gpu-sandbox', '--disable-background-networking',
      '--disable-component-update', '--no-first-run', '--disable-sync', '--no-default-browser-check'],
  });
}
