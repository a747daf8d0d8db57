// The console's end-to-end test in headless Chromium (driven by playwright-core), against
// the real binary on a private Redis with the project's fake model. Started by
// scripts/console-test.sh, which sets the environment below and starts the processes.
//
// It releases runs with every outcome (one of them hostile: <script>, <img onerror> and
// javascript: payloads in the query, the Draft, a tool record and the judge's reason),
// opens the console, types the token once, finds each run in the list, filters it, opens a
// blocked run and reads its rule and the judge's reason, cancels a run pending on a hanging
// model from its page and sees it become CANCELLED, and checks that no payload ever ran:
// no dialog, no injected element, no request to any other host. Screenshots go to OUT.
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const env = process.env;
const require = createRequire(path.join(env.PLAYWRIGHT_DIR, "node_modules", "x.js"));
const { chromium } = require("playwright-core");

const BASE = env.BASE;
const TOKEN = env.TOKEN;
const OUT = env.OUT;
const BIN = env.BIN;
const EXAMPLES = env.EXAMPLES;
mkdirSync(OUT, { recursive: true });

let failures = 0;
let passed = 0;
function check(ok, what) {
  if (ok) {
    passed += 1;
    console.log("  ok   " + what);
  } else {
    failures += 1;
    console.log("  FAIL " + what);
  }
}

// ---- runs ----------------------------------------------------------------------------------

const PAYLOADS = [
  "<script>window.__pwned='script';alert('script')</script>",
  "<img src=x onerror=\"window.__pwned='img';alert('img')\">",
  "<img src=\"http://198.51.100.7/beacon.png\">",
  "javascript:alert('href')",
];
const HOSTILE = PAYLOADS.join(" ");

// Seeds a bundle's records into the private Redis and answers its release body.
function seed(bundle) {
  const file = path.join(OUT, "bundle-" + bundle.run_id + ".json");
  writeFileSync(file, JSON.stringify(bundle));
  return JSON.parse(execFileSync(BIN, ["seed", file, "--print-body"], { env, encoding: "utf8" }));
}

function example(name, runId, edit) {
  const bundle = JSON.parse(readFileSync(path.join(EXAMPLES, name), "utf8"));
  // Each bundle keeps its own run id unless told: the invocations are stored under it.
  if (runId) {
    const old = bundle.run_id;
    const text = JSON.stringify(bundle).split(old).join(runId);
    Object.assign(bundle, JSON.parse(text));
  }
  if (edit) edit(bundle);
  return bundle;
}

async function release(runId, body) {
  const response = await fetch(BASE + "/v1/runs/" + runId + "/release", {
    method: "POST",
    headers: { Authorization: "Bearer " + TOKEN, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const result = await response.json();
  return { status: response.status, result, timing: response.headers.get("server-timing") };
}

const runs = [
  ["c-success", "success-supported.json", null, "SUCCESS", null],
  // The fake model's repair would fix the citation: this one rewrites the text, so the
  // repair is rejected.
  ["c-fabricated", "evidence-fabricated-call.json", (b) => { b.draft.limitations = ["[repair:rewrite]"]; }, "FALLBACK", "EVIDENCE_VALIDATION_FAILED"],
  ["c-repaired-unsupported", "repairable-wrong-call-id.json", (b) => { b.query += " [judge:UNSUPPORTED]"; }, "FALLBACK", "SEMANTIC_UNSUPPORTED"],
  ["c-unavailable", "success-supported.json", (b) => { b.query += " [judge:error]"; }, "FALLBACK", "SEMANTIC_UNAVAILABLE"],
  ["c-missing-context", "missing-required-context.json", null, "FALLBACK", "MISSING_REQUIRED_CONTEXT"],
  ["c-saturation", "controlled-stop-saturation.json", null, "FALLBACK", "INSUFFICIENT_EVIDENCE"],
  ["c-hostile", "success-supported.json", (b) => {
    b.query = "Why is order-api slow? " + HOSTILE + " [judge:UNSUPPORTED]";
    b.draft.conclusion.text = b.draft.conclusion.text + " " + HOSTILE + " [judge:echo]" + HOSTILE + "[/judge:echo]";
    b.draft.analyses[0].text = b.draft.analyses[0].text + " " + HOSTILE;
    // A tool record's scope: the log query the agent ran, shown as verified evidence.
    for (const inv of b.invocations) {
      if (inv.tool_name !== "log_search") continue;
      const projection = JSON.parse(inv.agent_result);
      projection.scope.query = "<img src=x onerror=\"window.__pwned='record'\"> javascript:alert('record')";
      inv.agent_result = JSON.stringify(projection);
    }
  }, "FALLBACK", "SEMANTIC_UNSUPPORTED"],
];

console.log("==> releasing " + runs.length + " runs through the API");
const released = {};
for (const [runId, file, edit, outcome, fallbackType] of runs) {
  const body = seed(example(file, runId, edit));
  const { status, result, timing } = await release(runId, body);
  released[runId] = result;
  check(status === 200 && result.outcome === outcome && result.fallback_type === fallbackType,
    runId + " released " + result.outcome + " " + result.fallback_type);
  check(/evidence;dur=[\d.]+, repair;dur=[\d.]+, judge;dur=[\d.]+, commit;dur=[\d.]+, harness;dur=[\d.]+/.test(timing || ""),
    runId + " answer has Server-Timing (" + timing + ")");
}

// The console's own headers.
const page0 = await fetch(BASE + "/console");
const csp = page0.headers.get("content-security-policy") || "";
check(csp.includes("script-src 'self'") && !csp.includes("unsafe-inline") && !csp.includes("unsafe-eval"), "CSP: " + csp);
check(page0.headers.get("x-frame-options") === "DENY", "X-Frame-Options DENY");
check(page0.headers.get("x-content-type-options") === "nosniff", "X-Content-Type-Options nosniff");
check(page0.headers.get("referrer-policy") === "no-referrer", "Referrer-Policy no-referrer");

// ---- the browser ---------------------------------------------------------------------------

// A fresh profile (playwright passes it as --user-data-dir).
const context = await chromium.launchPersistentContext(env.USER_DATA_DIR, {
  executablePath: env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1360, height: 900 },
  args: [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-quic", "--no-first-run", "--disable-sync",
  ],
});
const page = context.pages()[0] || (await context.newPage());
const dialogs = [];
const outside = [];
const consoleErrors = [];
page.on("dialog", async (dialog) => {
  dialogs.push(dialog.message());
  await dialog.dismiss();
});
page.on("request", (request) => {
  if (!request.url().startsWith(BASE + "/")) outside.push(request.url());
});
page.on("console", (message) => {
  if (message.type() === "error") consoleErrors.push(message.text());
});
page.on("pageerror", (error) => consoleErrors.push(String(error)));
page.setDefaultTimeout(15000);

try {
  console.log("==> the console in headless Chromium");
  await page.goto(BASE + "/console");
  await page.waitForSelector("#login:not([hidden])");
  await page.fill("#token", TOKEN);
  await page.click("#login-form button[type=submit]");
  await page.waitForSelector("#list-view:not([hidden])");
  for (const [runId] of runs) {
    await page.waitForSelector(`#decisions tr[data-run-id="${runId}"]`);
  }
  check(true, "every released run is in the decisions list");
  const counted = await page.textContent("#counts-5m");
  const tiles = counted.replace(/\s+/g, "");
  check(tiles.includes("1SUCCESS") && tiles.includes("6FALLBACK") && tiles.includes("0CANCELLED"), "counts per outcome over 5 minutes: " + tiles);
  check(!page.url().includes(TOKEN) && (await page.evaluate(() => sessionStorage.length)) === 1, "the token is in sessionStorage, not in the URL");

  // Filters.
  await page.selectOption("#filter-outcome", "FALLBACK");
  await page.waitForSelector('#decisions tr[data-run-id="c-success"]', { state: "detached" });
  await page.selectOption("#filter-fallback", "EVIDENCE_VALIDATION_FAILED");
  await page.waitForSelector('#decisions tr[data-run-id="c-hostile"]', { state: "detached" });
  const filtered = await page.$$eval("#decisions tr", (rows) => rows.map((r) => r.dataset.runId));
  check(filtered.length === 1 && filtered[0] === "c-fabricated", "filtered by outcome and fallback type: " + filtered.join(","));
  await page.selectOption("#filter-fallback", "");
  await page.selectOption("#filter-outcome", "");
  await page.waitForSelector('#decisions tr[data-run-id="c-success"]');
  await page.screenshot({ path: path.join(OUT, "console-list.png"), fullPage: true });

  // A blocked run: its rule and the judge's reason.
  await page.click('#decisions tr[data-run-id="c-repaired-unsupported"] a');
  await page.waitForSelector("#run-view:not([hidden]) #judge-reason");
  const rules = await page.textContent("#run-violations");
  check(rules.includes("call_missing"), "the blocked run shows its rule (call_missing)");
  const reason = await page.textContent("#judge-reason");
  check(reason.includes("no cited evidence shows"), "the blocked run shows the judge's reason: " + reason);
  const repair = await page.textContent("#run-repair");
  check(repair.includes("accepted") && repair.includes("→"), "the repair and what it changed: " + repair.replace(/\s+/g, " ").slice(0, 160));
  const attempts = await page.$$("#run-attempts .attempt");
  check(attempts.length === 2, "the model attempts timeline has the repair and the judge (" + attempts.length + ")");
  const evidence = await page.$$("#run-draft .cited .evidence");
  check(evidence.length >= 2, "analyses beside their verified evidence (" + evidence.length + " items)");
  await page.screenshot({ path: path.join(OUT, "console-run.png"), fullPage: true });

  // The evidence-blocked run: its rule, and no verdict.
  await page.goto(BASE + "/console#/run/c-fabricated");
  await page.waitForSelector("#run-view:not([hidden]) .rule-name");
  const fabricatedRules = await page.textContent("#run-violations");
  const verdictText = await page.textContent("#run-verdict");
  check(fabricatedRules.includes("call_missing") && verdictText.includes("No verdict"), "the evidence-blocked run lists its rule and has no verdict: " + fabricatedRules.replace(/\s+/g, " ").slice(0, 120));

  // The hostile run: every payload shown as text, none run.
  await page.goto(BASE + "/console#/run/c-hostile");
  await page.waitForSelector("#run-view:not([hidden]) #judge-reason");
  await page.waitForTimeout(300);
  const pageText = await page.textContent("body");
  check(pageText.includes("<script>window.__pwned='script'"), "the query and Draft show the <script> payload as text");
  check((await page.textContent("#judge-reason")).includes("<img src=x onerror="), "the judge's reason shows the <img onerror> payload as text");
  check((await page.textContent("#run-draft")).includes("window.__pwned='record'"), "the tool record's scope shows its payload as text");
  const injected = await page.evaluate(() => ({
    pwned: window.__pwned === undefined ? null : window.__pwned,
    scripts: document.scripts.length,
    images: document.images.length,
    handlers: document.querySelectorAll("[onerror],[onload],[onclick]").length,
    jsLinks: Array.from(document.links).filter((a) => a.protocol === "javascript:").length,
  }));
  check(injected.pwned === null && injected.scripts === 1 && injected.images === 0 && injected.handlers === 0 && injected.jsLinks === 0,
    "no payload ran and no element was injected " + JSON.stringify(injected));

  // Cancel a release pending on a hanging model.
  const hang = seed(example("success-supported.json", "c-hang", (b) => { b.query += " [judge:hang]"; }));
  const pending = release("c-hang", hang);
  await page.goto(BASE + "/console#/run/c-hang");
  await page.waitForSelector("#run-status .badge.pending");
  check((await page.textContent("#run-status")).includes("IN FLIGHT"), "the hanging run is shown in flight");
  await page.click("#cancel");
  await page.waitForSelector('#run-status .badge[data-outcome="CANCELLED"]');
  check(true, "after Cancel the run page shows CANCELLED");
  const cancelled = await pending;
  check(cancelled.result.outcome === "CANCELLED", "the pending release answered CANCELLED");
  await page.goto(BASE + "/console#/");
  await page.waitForSelector('#decisions tr[data-run-id="c-hang"]');
  check(true, "the cancelled run is in the list");

  check(dialogs.length === 0, "no dialog opened (" + dialogs.join(" | ") + ")");
  check(outside.length === 0, "no request left the harness's origin (" + outside.join(" ") + ")");
  check(consoleErrors.filter((e) => !e.includes("404")).length === 0, "no script error on the page (" + consoleErrors.join(" | ") + ")");
} catch (e) {
  failures += 1;
  console.log("  FAIL " + (e && e.stack ? e.stack : e));
  await page.screenshot({ path: path.join(OUT, "failure.png"), fullPage: true }).catch(() => {});
} finally {
  await context.close();
}

console.log(`console: ${passed} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
