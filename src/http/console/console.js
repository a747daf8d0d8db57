// The release-harness console: the decisions list (live), and one run's page.
//
// Everything shown comes from the agent or the model and is untrusted: it is only ever
// put on the page as text (textContent, attribute values set on elements built here),
// never parsed as HTML. The page's Content-Security-Policy runs this file alone (no inline
// script, no eval). The API token is kept in sessionStorage and sent as the Authorization
// header; it never goes into a URL.
"use strict";

(function () {
  const TOKEN_KEY = "release-harness-token";
  const POLL_MS = 2000;

  const MEANING = {
    SUCCESS: ["Released", "Both guards passed; the report is the agent's Draft, unchanged, with the sources it rests on.", "Read it; action plan items that need human confirmation still need a person."],
    EVIDENCE_VALIDATION_FAILED: ["Blocked: evidence does not hold", "The Draft cites evidence that does not exist in this run, failed, or does not fit the claim, and the one repair could not fix it without changing the text; or its text names a call id or Redis key. Nothing of the Draft was shown.", "The agent fabricated or mis-cited evidence: the violations below name each broken rule and call; rerun the investigation."],
    SEMANTIC_UNSUPPORTED: ["Blocked: the judge found it unsupported", "The evidence is real, but the judge found the conclusions go beyond it. The verified sources were listed.", "Look at the sources yourself; the judge's reason is below."],
    SEMANTIC_UNAVAILABLE: ["Blocked: the review could not be done", "The judge could not be asked or did not answer usably (model down, timeouts, malformed answers, or a budget or limit denied the call).", "Nothing is necessarily wrong with the Draft: check the model endpoint and retry."],
    MISSING_REQUIRED_CONTEXT: ["Needs context", "The agent made no tool call and asks for context.", "Answer its questions and ask again."],
    INSUFFICIENT_EVIDENCE: ["No conclusion", "No conclusion was reached (a no-conclusion Draft, a saturation or budget stop, or an unparseable Draft). The observed facts list the checks that completed.", "Use the facts as a starting point; widen the investigation."],
    CANCELLED: ["Cancelled", "The run was cancelled before the release finished; any pending model call was aborted.", "Nothing: it was asked for."],
  };

  const $ = (id) => document.getElementById(id);
  let timer = null;
  let older = null; // the cursor of the next page, when more were asked for
  let extraPages = []; // decisions loaded with "Older decisions"

  // ---- building the page out of text -------------------------------------------------

  // An element with `text` as its text (never as markup) and the given class.
  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
    return node;
  }

  function meaningKey(outcome, fallbackType) {
    return outcome === "FALLBACK" ? fallbackType : outcome;
  }

  function badge(outcome, fallbackType) {
    const key = meaningKey(outcome, fallbackType) || "";
    const cls = outcome === "SUCCESS" ? "ok" : outcome === "CANCELLED" ? "cancelled" : "blocked";
    const text = outcome === "FALLBACK" && fallbackType ? "FALLBACK " + fallbackType : outcome || "?";
    const b = el("span", text, "badge " + cls);
    b.dataset.outcome = key;
    return b;
  }

  function runLink(runId) {
    const a = el("a", runId, "run-link");
    // A fragment link only: whatever the id holds, it cannot become another scheme.
    a.href = "#/run/" + encodeURIComponent(runId);
    return a;
  }

  function ms(value) {
    return typeof value === "number" ? value.toFixed(1) : "–";
  }

  // A value of any JSON shape, as nested text (scopes, rows, stored results).
  function valueText(value) {
    if (value === null || value === undefined) return "null";
    if (typeof value === "string") return value;
    return JSON.stringify(value);
  }

  function keyValues(obj) {
    const dl = el("dl", null, "kv");
    for (const [k, v] of Object.entries(obj || {})) {
      dl.appendChild(el("dt", k));
      dl.appendChild(el("dd", valueText(v)));
    }
    return dl;
  }

  // ---- the API -------------------------------------------------------------------------

  function token() {
    return sessionStorage.getItem(TOKEN_KEY);
  }

  class Unauthorized extends Error {}

  async function api(method, path) {
    const response = await fetch(path, {
      method,
      headers: { Authorization: "Bearer " + (token() || ""), Accept: "application/json" },
      credentials: "omit",
      cache: "no-store",
      referrerPolicy: "no-referrer",
    });
    if (response.status === 401) throw new Unauthorized();
    if (response.status === 404) return null;
    if (!response.ok) throw new Error(method + " " + path + ": HTTP " + response.status);
    return response.json();
  }

  // ---- views ---------------------------------------------------------------------------

  function show(view) {
    for (const id of ["login", "list-view", "run-view"]) $(id).hidden = id !== view;
    $("forget").hidden = view === "login";
  }

  function askToken(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    stop();
    show("login");
    $("login-error").textContent = message || "";
    $("token").focus();
  }

  function stop() {
    if (timer) clearTimeout(timer);
    timer = null;
  }

  function every(fn) {
    stop();
    const tick = async () => {
      try {
        await fn();
        $("live").textContent = "live · updated " + new Date().toLocaleTimeString();
      } catch (e) {
        if (e instanceof Unauthorized) return askToken("The token was refused.");
        $("live").textContent = "not updated: " + e.message;
      }
      timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  function route() {
    if (!token()) return askToken("");
    const match = location.hash.match(/^#\/run\/(.+)$/);
    if (match) {
      let runId;
      try {
        runId = decodeURIComponent(match[1]);
      } catch (e) {
        runId = match[1];
      }
      show("run-view");
      runPage(runId);
    } else {
      show("list-view");
      extraPages = [];
      older = null;
      every(refreshList);
    }
  }

  // ---- the decisions list --------------------------------------------------------------

  function filterQuery(extra) {
    const params = new URLSearchParams();
    params.set("limit", "50");
    if ($("filter-outcome").value) params.set("outcome", $("filter-outcome").value);
    if ($("filter-fallback").value) params.set("fallback_type", $("filter-fallback").value);
    if (extra) params.set("before", extra);
    return params.toString();
  }

  function tiles(node, counts) {
    clear(node);
    for (const outcome of ["SUCCESS", "FALLBACK", "CANCELLED"]) {
      const tile = el("div", null, "tile " + outcome.toLowerCase());
      tile.appendChild(el("span", String((counts && counts[outcome]) || 0), "n"));
      tile.appendChild(el("span", outcome, "label"));
      node.appendChild(tile);
    }
  }

  function decisionRow(d) {
    const tr = el("tr");
    tr.dataset.runId = d.run_id;
    const when = d.time ? new Date(d.time) : null;
    tr.appendChild(el("td", when && !isNaN(when) ? when.toLocaleTimeString() : d.time));
    const run = el("td");
    run.appendChild(runLink(d.run_id));
    tr.appendChild(run);
    const outcome = el("td");
    outcome.appendChild(badge(d.outcome, d.fallback_type));
    tr.appendChild(outcome);
    const meaning = MEANING[meaningKey(d.outcome, d.fallback_type)];
    tr.appendChild(el("td", meaning ? meaning[0] : ""));
    tr.appendChild(el("td", d.verdict || "–"));
    tr.appendChild(el("td", ms(d.total_ms), "num"));
    tr.appendChild(el("td", ms(d.overhead_ms), "num"));
    tr.appendChild(el("td", d.model_attempts === null ? "–" : d.model_attempts, "num"));
    tr.appendChild(el("td", d.replica, "muted"));
    return tr;
  }

  async function refreshList() {
    const [overview, page] = await Promise.all([
      api("GET", "/v1/overview"),
      api("GET", "/v1/decisions?" + filterQuery()),
    ]);
    if (overview) {
      $("replica").textContent = "replica " + overview.replica;
      tiles($("counts-5m"), overview.last_5m);
      tiles($("counts-60m"), overview.last_60m);
      const list = clear($("in-flight"));
      $("in-flight-count").textContent = "(" + overview.in_flight.length + " on this replica)";
      for (const run of overview.in_flight) {
        const li = el("li");
        li.appendChild(runLink(run.run_id));
        li.appendChild(el("span", " for " + (run.running_ms / 1000).toFixed(1) + " s", "muted"));
        list.appendChild(li);
      }
      if (!overview.in_flight.length) list.appendChild(el("li", "none", "muted"));
    }
    const body = clear($("decisions"));
    const all = (page ? page.decisions : []).concat(extraPages);
    for (const d of all) body.appendChild(decisionRow(d));
    $("list-empty").hidden = all.length > 0;
    if (!extraPages.length) older = page ? page.next_before : null;
    $("older").hidden = !older;
  }

  async function loadOlder() {
    if (!older) return;
    const page = await api("GET", "/v1/decisions?" + filterQuery(older));
    if (page) {
      extraPages = extraPages.concat(page.decisions);
      older = page.next_before;
    }
    await refreshList();
  }

  // ---- one run -------------------------------------------------------------------------

  function section(id, visible) {
    $(id).hidden = !visible;
  }

  function evidenceItem(item) {
    const box = el("div", null, "evidence");
    const head = el("div", null, "evidence-head");
    head.appendChild(el("strong", item.tool));
    head.appendChild(el("span", " " + item.evidence_status, "muted"));
    if (item.source) head.appendChild(el("span", " · " + item.source));
    if (item.observed_at) head.appendChild(el("span", " · " + item.observed_at, "muted"));
    box.appendChild(head);
    box.appendChild(keyValues(item.scope));
    if (Array.isArray(item.hits)) {
      for (const hit of item.hits) {
        const p = el("p", null, "excerpt");
        p.appendChild(el("strong", (hit.title || hit.source) + ": "));
        p.appendChild(document.createTextNode(hit.excerpt));
        box.appendChild(p);
      }
    }
    if (Array.isArray(item.entries)) {
      box.appendChild(el("p", item.total_matches + " matches", "muted"));
      for (const entry of item.entries) {
        box.appendChild(el("p", [entry.timestamp, entry.host, entry.level, entry.message].filter(Boolean).join("  "), "excerpt mono"));
      }
    }
    if (Array.isArray(item.rows)) {
      const table = el("table", null, "rows");
      const head = el("tr");
      for (const c of item.columns || []) head.appendChild(el("th", c));
      table.appendChild(head);
      for (const row of item.rows) {
        const tr = el("tr");
        for (const cell of row) tr.appendChild(el("td", valueText(cell)));
        table.appendChild(tr);
      }
      box.appendChild(el("p", item.row_count + " rows", "muted"));
      box.appendChild(table);
    }
    return box;
  }

  function citedIds(draft) {
    const ids = {};
    for (const a of (draft && draft.analyses) || []) ids[a.id] = (a.tool_call_ids || []).join(", ");
    return ids;
  }

  function renderDraft(view) {
    const out = clear($("run-draft"));
    const draft = view && (view.repaired_draft || view.draft);
    if (!draft) {
      out.appendChild(el("p", view && view.omitted && view.omitted.includes("draft") ? "The Draft was too large to keep in the audit record." : "No parsed Draft (a controlled stop, or a Draft that could not be parsed).", "muted"));
      return;
    }
    const evidence = {};
    for (const a of (view.evidence && view.evidence.analyses) || []) evidence[a.analysis_id] = a.evidence;
    if (draft.conclusion) {
      const c = el("div", null, "conclusion");
      c.appendChild(el("h3", "Conclusion"));
      c.appendChild(el("p", draft.conclusion.text, "quote"));
      c.appendChild(el("p", "rests on " + (draft.conclusion.analysis_refs || []).join(", "), "muted"));
      out.appendChild(c);
    } else {
      out.appendChild(el("p", "No conclusion.", "muted"));
    }
    for (const a of draft.analyses || []) {
      const row = el("div", null, "analysis");
      const claim = el("div", null, "claim");
      claim.appendChild(el("h3", a.id + " · " + a.kind));
      claim.appendChild(el("p", a.text, "quote"));
      claim.appendChild(el("p", "cites " + ((a.tool_call_ids || []).join(", ") || "nothing"), "muted mono"));
      row.appendChild(claim);
      const cited = el("div", null, "cited");
      const items = evidence[a.id];
      if (items && items.length) {
        for (const item of items) cited.appendChild(evidenceItem(item));
      } else {
        cited.appendChild(el("p", view.evidence ? "no verified evidence" : "not verified: the Draft did not reach the judge", "muted"));
      }
      row.appendChild(cited);
      out.appendChild(row);
    }
    for (const [title, list] of [["Action plan", draft.action_plan], ["Recommendations", draft.recommendations]]) {
      if (!list || !list.length) continue;
      out.appendChild(el("h3", title));
      const ul = el("ul");
      for (const item of list) {
        const extra = item.requires_human_confirmation ? " (needs human confirmation)" : "";
        ul.appendChild(el("li", item.text + extra));
      }
      out.appendChild(ul);
    }
    for (const [title, list] of [["Limitations", draft.limitations], ["Missing context", draft.missing_context]]) {
      if (!list || !list.length) continue;
      out.appendChild(el("h3", title));
      const ul = el("ul");
      for (const item of list) ul.appendChild(el("li", item));
      out.appendChild(ul);
    }
  }

  function renderViolations(audit) {
    const out = clear($("run-violations"));
    const groups = {};
    const add = (v, where) => {
      (groups[v.rule] = groups[v.rule] || []).push([where, v]);
    };
    for (const v of audit.violations || []) add(v, "submitted Draft");
    for (const v of (audit.repair && audit.repair.violations_after) || []) add(v, "repaired Draft");
    for (const v of audit.excluded_references || []) add(v, "reference left out");
    const rules = Object.keys(groups);
    section("sec-violations", rules.length > 0);
    for (const rule of rules) {
      const box = el("div", null, "rule");
      box.appendChild(el("h3", rule + " (" + groups[rule].length + ")", "rule-name"));
      const ul = el("ul");
      for (const [where, v] of groups[rule]) {
        const parts = [where, v.at, v.tool_call_id, v.detail || v.reason].filter(Boolean);
        ul.appendChild(el("li", parts.join(" · ")));
      }
      box.appendChild(ul);
      out.appendChild(box);
    }
  }

  function renderRepair(audit, view) {
    const out = clear($("run-repair"));
    const repair = audit.repair;
    section("sec-repair", !!repair);
    if (!repair) return;
    out.appendChild(el("p", repair.ran ? (repair.accepted ? "Ran, accepted." : "Ran, rejected.") : "Did not run."));
    out.appendChild(el("p", repair.reason, "quote"));
    if (view && view.draft && view.repaired_draft) {
      const before = citedIds(view.draft);
      const after = citedIds(view.repaired_draft);
      const ul = el("ul", null, "changes");
      for (const id of Object.keys(after)) {
        if (before[id] !== after[id]) ul.appendChild(el("li", id + ": cites " + (before[id] || "nothing") + " → " + (after[id] || "nothing"), "mono"));
      }
      if (!ul.firstChild) ul.appendChild(el("li", "no citation changed", "muted"));
      out.appendChild(el("h3", "What changed"));
      out.appendChild(ul);
    }
  }

  function renderAttempts(audit) {
    const out = clear($("run-attempts"));
    const attempts = audit.model_attempts || [];
    if (!attempts.length) {
      out.appendChild(el("p", "No model call.", "muted"));
      return;
    }
    const longest = Math.max(1, ...attempts.map((a) => a.latency_ms || 0));
    for (const a of attempts) {
      const row = el("div", null, "attempt " + a.outcome);
      row.appendChild(el("span", a.role + " #" + a.attempt, "who"));
      const track = el("span", null, "track");
      const bar = el("span", null, "bar");
      bar.style.width = Math.max(1, (100 * (a.latency_ms || 0)) / longest) + "%";
      track.appendChild(bar);
      row.appendChild(track);
      const tokens = a.prompt_tokens === null && a.completion_tokens === null ? "no tokens" : (a.prompt_tokens || 0) + " + " + (a.completion_tokens || 0) + " tokens";
      row.appendChild(el("span", a.outcome + " · " + ms(a.latency_ms) + " ms · " + tokens + (a.detail ? " · " + a.detail : ""), "what"));
      out.appendChild(row);
    }
  }

  function renderVerdict(audit) {
    const out = clear($("run-verdict"));
    if (!audit.verdict) {
      out.appendChild(el("p", "No verdict: the judge was not asked, or gave no usable answer.", "muted"));
      return;
    }
    out.appendChild(el("p", audit.verdict.verdict, "badge " + (audit.verdict.verdict === "SUPPORTED" ? "ok" : "blocked")));
    const reason = el("p", audit.verdict.reason, "quote");
    reason.id = "judge-reason";
    out.appendChild(reason);
  }

  function renderTimings(audit) {
    const out = clear($("run-timings"));
    out.appendChild(keyValues(Object.assign({}, audit.timings, { budget: audit.budget, path: audit.path, draft_error: audit.draft_error, cancelled_by: audit.cancelled_by })));
  }

  async function runPage(runId) {
    $("run-id").textContent = runId;
    for (const id of ["run-query", "run-result", "cancel-note"]) $(id).textContent = "";
    for (const id of ["run-draft", "run-violations", "run-repair", "run-attempts", "run-verdict", "run-timings", "run-status"]) clear($(id));
    $("run-meaning").textContent = "";
    $("cancel").hidden = true;
    $("cancel").onclick = async () => {
      $("cancel").disabled = true;
      try {
        await api("POST", "/v1/runs/" + encodeURIComponent(runId) + "/cancel");
        $("cancel-note").textContent = "Cancel sent: the release is aborted on whichever replica runs it.";
      } catch (e) {
        if (e instanceof Unauthorized) return askToken("The token was refused.");
        $("cancel-note").textContent = "Cancel failed: " + e.message;
      } finally {
        $("cancel").disabled = false;
      }
    };
    let done = false;
    every(async () => {
      if (done) return;
      const [result, audit, overview] = await Promise.all([
        api("GET", "/v1/runs/" + encodeURIComponent(runId) + "/release"),
        api("GET", "/v1/runs/" + encodeURIComponent(runId) + "/audit"),
        api("GET", "/v1/overview"),
      ]);
      const status = clear($("run-status"));
      const inFlight = overview && overview.in_flight.find((r) => r.run_id === runId);
      const shown = !!(result && audit);
      for (const id of ["sec-query", "sec-draft", "sec-violations", "sec-repair", "sec-attempts", "sec-verdict", "sec-result", "sec-timings"]) section(id, shown);
      if (!shown) {
        status.appendChild(el("span", inFlight ? "IN FLIGHT" : "NOT FOUND", "badge " + (inFlight ? "pending" : "cancelled")));
        $("run-meaning").textContent = inFlight
          ? "The release is running on this replica (" + (inFlight.running_ms / 1000).toFixed(1) + " s so far)."
          : "No result is stored for this run, and no release of it runs on this replica.";
        // A release in flight on another replica is cancelled the same way.
        $("cancel").hidden = false;
        return;
      }
      done = true;
      $("cancel").hidden = true;
      status.appendChild(badge(result.outcome, result.fallback_type));
      const meaning = MEANING[meaningKey(result.outcome, result.fallback_type)];
      $("run-meaning").textContent = meaning ? meaning[1] + " " + meaning[2] : "";
      const view = audit.view || null;
      $("run-query").textContent = view ? view.query : "(not recorded)";
      renderDraft(view);
      renderViolations(audit);
      renderRepair(audit, view);
      renderAttempts(audit);
      renderVerdict(audit);
      $("run-result").textContent = JSON.stringify(result, null, 2);
      renderTimings(audit);
    });
  }

  // ---- wiring --------------------------------------------------------------------------

  function start() {
    const legend = $("legend");
    for (const [key, words] of Object.entries(MEANING)) {
      const dt = el("dt");
      dt.appendChild(el("span", key === "SUCCESS" || key === "CANCELLED" ? key : "FALLBACK " + key, "badge " + (key === "SUCCESS" ? "ok" : key === "CANCELLED" ? "cancelled" : "blocked")));
      dt.appendChild(el("span", " " + words[0]));
      legend.appendChild(dt);
      legend.appendChild(el("dd", words[1] + " " + words[2]));
    }
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("token").value.trim();
      $("token").value = "";
      if (!value) return;
      sessionStorage.setItem(TOKEN_KEY, value);
      route();
    });
    $("forget").addEventListener("click", () => askToken("Token forgotten."));
    $("filter-outcome").addEventListener("change", route);
    $("filter-fallback").addEventListener("change", route);
    $("older").addEventListener("click", () => loadOlder().catch(() => {}));
    $("goto-run").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && event.target.value.trim()) {
        location.hash = "#/run/" + encodeURIComponent(event.target.value.trim());
      }
    });
    window.addEventListener("hashchange", route);
    route();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
