// tests/players.rs drives this: headless Chromium (puppeteer-core, no browser
// download) plays PAGE; prints "PLAYING" once both videos advance; then obeys stdin:
// "shot FILE" takes a screenshot, "state" prints the players' times and beacons, "quit"
// ends.
//
//     node play.mjs CHROMIUM PAGE_URL
import puppeteer from 'puppeteer-core';
import { createInterface } from 'node:readline';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const [chromium, url] = process.argv.slice(2);
const profile = mkdtempSync(join(tmpdir(), 'steerdns-chromium-'));
const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--autoplay-policy=no-user-gesture-required', `--user-data-dir=${profile}`,
  ],
});
const quit = async (code) => {
  await browser.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
  process.exit(code);
};
const page = await browser.newPage();
await page.setViewport({ width: 700, height: 260 });
page.on('console', (m) => { if (m.type() === 'error') console.error('page:', m.text()); });
page.on('pageerror', (e) => console.error('page error:', e.message));
await page.goto(url);
const times = () => page.evaluate(() => ({
  hls: document.getElementById('hls').currentTime,
  dash: document.getElementById('dash').currentTime,
  errors: window.errors,
  beacons: window.beacons,
}));
const deadline = Date.now() + 60000;
for (;;) {
  const t = await times();
  if (t.hls > 1 && t.dash > 1) break;
  if (Date.now() > deadline) {
    console.log('NOT PLAYING ' + JSON.stringify(t));
    await quit(1);
  }
  await new Promise((r) => setTimeout(r, 100));
}
console.log('PLAYING');
for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, arg] = line.trim().split(/\s+/, 2);
  if (cmd === 'shot') {
    await page.screenshot({ path: arg });
    console.log('SHOT ' + arg);
  } else if (cmd === 'state') {
    console.log('STATE ' + JSON.stringify(await times()));
  } else if (cmd === 'quit') {
    break;
  }
}
await quit(0);
