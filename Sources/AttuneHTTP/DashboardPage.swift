/// The operators' page itself: its HTML, style and script, served by `Dashboard`. The script polls
/// `/api/fleet` (one snapshot shared by every tab) and follows `/api/events`; actions carry the token of
/// `/api/session` and ask for confirmation first.
enum DashboardPage {
    static let html = #"""
    <!doctype html>
    <html lang="en"><head><meta charset="utf-8"><title>Attune</title>
    <link rel="stylesheet" href="/dashboard/app.css"></head>
    <body>
    <h1>Attune <small id="status">connecting…</small> <small id="operator"></small></h1>
    <nav><a href="#fleet">Fleet</a> · <a href="#jobs-view">Jobs</a> · <a href="#dead-view">Dead letters</a> ·
      <a href="#audit-view">Audit log</a> · <a href="#rebases-view">Rebases</a> · <a href="#history-view">Versions</a></nav>
    <section id="fleet">
    <h2>Throughput <small>(jobs completed per second, from the outcomes table)</small></h2>
    <div class="throughput"><canvas id="throughput"></canvas></div>
    <h2>Workers <small id="workers-summary"></small></h2>
    <table><thead><tr><th>worker</th><th>state</th><th>host</th><th>release</th><th>kernels</th><th>slots busy</th>
      <th>in hand</th><th>jobs/s</th><th>partitions</th><th>last look</th></tr></thead><tbody id="workers"></tbody></table>
    <h2>Queues <small id="queues-summary"></small></h2>
    <table><thead><tr><th>queue</th><th>kind</th><th>jobs</th><th>consumers</th><th>held by</th><th>oldest / wait</th><th>note</th></tr></thead>
    <tbody id="queues"></tbody></table>
    </section>
    <section id="jobs-view">
    <h2>Find jobs</h2>
    <form id="search-form">job ids <textarea id="search-ids" rows="2" cols="40" placeholder="one or more, separated by spaces, commas or lines"></textarea>
      or user <input id="search-user" size="14"> model <input id="search-model" size="12"> <button>find</button></form>
    <table><thead><tr><th>job</th><th>user</th><th>model</th><th>state</th><th>reason</th><th>version</th><th>attempts</th><th>worker</th><th>when</th><th></th></tr></thead>
    <tbody id="search-results"></tbody></table>
    <h2>Jobs <small>(newest first: the outcomes table at load, then live)</small></h2>
    <table><thead><tr><th>job</th><th>user</th><th>model</th><th>state</th><th>reason</th><th>epoch</th><th>loss</th><th>version</th></tr></thead>
    <tbody id="jobs"></tbody></table>
    <h2>Loss per epoch</h2>
    <div class="charts" id="charts"></div>
    </section>
    <section id="dead-view">
    <h2>Dead letters <small id="dlq-depth"></small></h2>
    <form id="dlq-filter-form">user <input id="dlq-user" size="14"> model <input id="dlq-model" size="12">
      reason containing <input id="dlq-reason" size="20">
      <button type="button" id="dlq-replay-matching">replay matching</button> <button type="button" id="dlq-purge-matching">purge matching</button></form>
    <p id="action-result" role="status"></p>
    <table><thead><tr><th>#</th><th>job</th><th>user</th><th>model</th><th>attempts</th><th>reason</th><th>dead since</th><th></th></tr></thead><tbody id="dlq"></tbody></table>
    </section>
    <section id="audit-view">
    <h2>Audit log</h2>
    <table><thead><tr><th>when</th><th>operator</th><th>from</th><th>action</th><th>target</th><th>jobs</th></tr></thead><tbody id="audit"></tbody></table>
    </section>
    <section id="rebases-view">
    <h2>Rebases</h2>
    <table><thead><tr><th>rebase</th><th>model</th><th>onto base</th><th>state</th><th>users</th><th>rebased</th><th>moved</th><th>stayed</th><th>failed</th><th>cancelled</th><th>to come</th></tr></thead><tbody id="rebases"></tbody></table>
    </section>
    <section id="history-view">
    <h2>A user's versions</h2>
    <form id="history-form">model <input id="h-model" size="12"> user <input id="h-user" size="12"> <button>show</button></form>
    <table><thead><tr><th>version</th><th>base</th><th>samples</th><th>epochs</th><th>loss</th><th>job</th><th>when</th></tr></thead>
    <tbody id="history"></tbody></table>
    </section>
    <script src="/dashboard/chart.js"></script>
    <script src="/dashboard/app.js"></script></body></html>
    """#

    static let style = #"""
      body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
      h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; } h2 small, h1 small { font-weight: normal; color: #666; }
      section { margin-bottom: 2em; } nav { margin-bottom: 1em; }
      table { border-collapse: collapse; } td, th { padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
      td.reason { max-width: 420px; font-size: 12px; color: #555; }
      .charts { display: flex; flex-wrap: wrap; gap: 12px; } .job { width: 300px; border: 1px solid #ddd; padding: 6px; }
      .job h3 { font-size: 12px; margin: 0 0 4px; font-weight: normal; } .failed, .gone, .unheld { color: #b00; } .completed, .live { color: #070; }
      .silent, .retrying, .held, .parked { color: #a60; }
      .throughput { width: 620px; height: 160px; }
      button.small { font-size: 11px; padding: 0 4px; }
    """#

    static let script = #"""
    const jobs = new Map(), charts = new Map();
    const state = { fleet: null, fleetMillis: [], snapshotMillis: [], token: null, operator: null };
    window.attuneDashboard = { jobs, charts, state };
    const $ = id => document.getElementById(id);
    const cell = (row, text, cls) => { const td = row.insertCell(); td.textContent = text ?? ""; if (cls) td.className = cls; return td; };
    const ago = iso => { if (!iso) return ""; const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000); return s < 90 ? s.toFixed(0) + " s ago" : (s / 60).toFixed(0) + " min ago"; };
    const seconds = s => s == null ? "" : s < 90 ? s.toFixed(0) + " s" : s < 5400 ? (s / 60).toFixed(0) + " min" : (s / 3600).toFixed(1) + " h";
    const throughput = new Chart($("throughput"), {
      type: "line", data: { labels: [], datasets: [{ label: "jobs/s", data: [], borderColor: "#36c", tension: 0.2 }] },
      options: { animation: false, maintainAspectRatio: false, plugins: { legend: { display: false } },
                 scales: { y: { beginAtZero: true, suggestedMax: 1 } } } });

    async function api(path, options) {
      const response = await fetch(path, options);
      const text = await response.text();
      if (!response.ok) throw new Error(text.trim() || response.status);
      return JSON.parse(text);
    }
    async function act(path, body, question) {
      if (!window.confirm(question)) return null;
      if (!state.token) await loadSession();
      try {
        const result = await api(path, { method: "POST", body: JSON.stringify(body),
          headers: { "Content-Type": "application/json", "X-Attune-CSRF": state.token } });
        $("action-result").textContent = JSON.stringify(result);
        loadFleet(true); loadAudit();
        return result;
      } catch (err) { $("action-result").textContent = "refused: " + err.message; return null; }
    }
    async function loadSession() {
      const session = await api("/api/session"); state.token = session.csrfToken; state.operator = session.operator;
      $("operator").textContent = "· " + session.operator;
    }

    // Events only update the jobs' records (cheap at thousands a second); the tables and charts are drawn
    // from them once a second, a chart for each of the few jobs updated last.
    const chartsShown = 12, jobsKept = 5000;
    function chartFor(job) {
      if (charts.has(job.id)) return charts.get(job.id);
      const box = document.createElement("div"); box.className = "job"; box.dataset.job = job.id;
      const title = document.createElement("h3"); title.textContent = job.id + " · " + job.user; box.appendChild(title);
      const canvas = document.createElement("canvas"); canvas.width = 280; canvas.height = 140; box.appendChild(canvas);
      $("charts").insertBefore(box, $("charts").firstChild);
      const chart = new Chart(canvas, { type: "line", data: { labels: [], datasets: [
          { label: "loss", data: [], borderColor: "#c33", yAxisID: "y" },
          { label: "validation accuracy", data: [], borderColor: "#393", yAxisID: "y1", hidden: true } ] },
        options: { animation: false, responsive: false, scales: { y: { position: "left" }, y1: { position: "right", min: 0, max: 1 } } } });
      chart.box = box; charts.set(job.id, chart); return chart;
    }
    function renderCharts(newest) {
      const wanted = newest.filter(job => job.losses && job.losses.length).slice(0, chartsShown);
      const keep = new Set(wanted.map(job => job.id));
      for (const [id, chart] of charts) if (!keep.has(id)) { chart.destroy(); chart.box.remove(); charts.delete(id); }
      wanted.forEach(job => {
        const chart = chartFor(job);
        if (chart.data.datasets[0].data.length === job.losses.length) return;
        chart.data.labels = job.losses.map((_, i) => i + 1); chart.data.datasets[0].data = job.losses.slice();
        if (job.accuracies.some(a => a != null)) { chart.data.datasets[1].hidden = false; chart.data.datasets[1].data = job.accuracies.slice(); }
        chart.update();
      });
    }
    function renderJobs() {
      const newest = [...jobs.values()].sort((a, b) => b.updated - a.updated);
      newest.slice(jobsKept).forEach(job => jobs.delete(job.id));
      const body = $("jobs"); body.replaceChildren();
      newest.slice(0, 50).forEach(job => {
        const row = body.insertRow(); row.dataset.job = job.id;
        cell(row, job.id); cell(row, job.user); cell(row, job.model); cell(row, job.state, job.state); cell(row, job.reason, "reason");
        cell(row, job.epochs ? job.epoch + "/" + job.epochs : ""); cell(row, job.loss != null ? job.loss.toFixed(4) : "");
        cell(row, job.version ?? "");
      });
      renderCharts(newest);
    }
    function fromOutcome(o) {
      const job = jobs.get(o.jobId) ?? { id: o.jobId, epoch: 0, losses: [], accuracies: [] };
      Object.assign(job, { user: o.userId ?? "~", model: o.model ?? "~", state: o.state, reason: o.reason, version: o.version,
                           loss: o.loss, updated: o.updatedAt ? Date.parse(o.updatedAt) : 0 });
      jobs.set(o.jobId, job);
    }
    function onEvent(e) {
      if (!e.jobId) return;
      const job = jobs.get(e.jobId) ?? { id: e.jobId, user: e.userId ?? "~", model: e.model ?? "~", state: "queued", epoch: 0,
                                         losses: [], accuracies: [] };
      jobs.set(e.jobId, job); job.updated = Date.now();
      // Event contract 2: a short job's epochs ride on its terminal event, drawn as if each had come alone.
      (e.epochMetrics ?? []).forEach(m => {
        job.epoch = Number(m.epoch); job.loss = m.loss;
        if (job.losses.length < 10000) { job.losses.push(m.loss ?? null); job.accuracies.push(m.validationAccuracy ?? null); }
      });
      if (e.kind === "COMPLETED" && e.epochMetrics) job.epochs = e.epochMetrics.length;
      switch (e.kind) {
        case "TRAINING_BEGIN": job.state = "training"; job.epochs = Number(e.epochs ?? 0); break;
        case "EPOCH_END":
          job.state = "training"; job.epoch = Number(e.epoch); job.epochs = Number(e.epochs ?? job.epochs); job.loss = e.loss;
          if (job.losses.length < 10000) { job.losses.push(e.loss ?? null); job.accuracies.push(e.validationAccuracy ?? null); }
          break;
        case "COMPLETED": job.state = "completed"; job.version = e.version; job.reason = ""; if (e.loss != null) job.loss = e.loss; break;
        case "FAILED": job.state = e.willRetry ? "retrying" : "failed"; job.reason = e.reason; break;
        case "CANCELLED": job.state = "cancelled"; job.reason = e.reason; break;
        case "HELD": job.state = "held"; job.version = e.version; job.reason = e.reason; break;
      }
    }

    function renderFleet(fleet) {
      const live = fleet.workers.filter(w => w.state === "live").length;
      $("workers-summary").textContent = "(" + live + " live of " + fleet.workers.length + " shown)";
      const workers = $("workers"); workers.replaceChildren();
      fleet.workers.forEach(w => {
        const row = workers.insertRow(); row.dataset.worker = w.name; row.dataset.state = w.state;
        cell(row, w.name); cell(row, w.state === "gone" ? "gone " + ago(w.goneSince) : w.state, w.state); cell(row, w.host);
        cell(row, w.release); cell(row, w.kernels ?? (w.state === "gone" ? "" : "no /metrics"));
        cell(row, w.slots != null && w.busySlots != null ? w.busySlots + " of " + w.slots : "");
        cell(row, w.deliveriesInHand); cell(row, w.jobsPerSecond != null ? w.jobsPerSecond.toFixed(1) : "");
        cell(row, w.state === "gone" ? "" : w.partitions.length ? w.partitions.join(" ") : "stands by"); cell(row, ago(w.lastLook));
      });
      const queues = $("queues"); queues.replaceChildren();
      const shown = fleet.queues.filter(q => q.kind !== "partition" || q.depth || q.unheld || fleet.queues.length < 40);
      $("queues-summary").textContent = "(" + fleet.unheldPartitions + " partition(s) unheld" +
        (shown.length < fleet.queues.length ? "; empty held partitions hidden" : "") + ")";
      shown.forEach(q => {
        const row = queues.insertRow(); row.dataset.queue = q.name; row.dataset.kind = q.kind;
        cell(row, q.name); cell(row, q.kind, q.kind); cell(row, q.depth ?? "missing"); cell(row, q.consumers ?? "");
        cell(row, q.unheld ? "nobody" : q.holder ?? "", q.unheld ? "unheld" : "");
        cell(row, q.oldestSeconds != null ? seconds(q.oldestSeconds) : q.waitEstimateSeconds != null ? "≈ " + seconds(q.waitEstimateSeconds) + " wait"
                  : q.retryDelaySeconds != null ? "≤ " + seconds(q.retryDelaySeconds) : "");
        cell(row, q.kind === "parked" ? (q.parkedUsers ?? 0) + " hot user(s) parked" : "", q.kind === "parked" ? "parked" : "");
      });
      const width = fleet.throughputIntervalSeconds;
      throughput.data.labels = fleet.throughput.map(i => new Date(Date.parse(i.start)).toLocaleTimeString());
      throughput.data.datasets[0].data = fleet.throughput.map(i => i.jobs / width);
      throughput.update();
      const dead = fleet.deadLetters;
      $("dlq-depth").textContent = "(" + dead.depth + " in the queue" + (dead.busy ? "; a replay or purge is running" : dead.depth > dead.letters.length ? "; the first " + dead.letters.length + " shown" : "") +
        (dead.reading ? "; reading…" : "") + ")";
      if (dead.busy) return;
      const body = $("dlq"); body.replaceChildren();
      dead.letters.forEach(l => {
        const row = body.insertRow(); row.dataset.job = l.jobId;
        cell(row, l.position); cell(row, l.jobId); cell(row, l.userId); cell(row, l.model); cell(row, l.attempts); cell(row, l.reason, "reason");
        cell(row, ago(l.deadLetteredAt));
        const buttons = row.insertCell();
        if (l.jobId) {
          const replay = document.createElement("button"); replay.className = "small replay"; replay.textContent = "replay";
          replay.onclick = () => act("/api/actions/dlq-replay", { jobIds: [l.jobId] }, "Replay dead job " + l.jobId + "?");
          const purge = document.createElement("button"); purge.className = "small purge"; purge.textContent = "purge";
          purge.onclick = () => act("/api/actions/dlq-purge", { jobIds: [l.jobId] }, "Delete dead job " + l.jobId + " for good?");
          buttons.append(replay, " ", purge);
        }
      });
    }
    async function loadFleet(force) {
      const started = performance.now();
      try {
        const fleet = await api("/api/fleet");
        state.fleetMillis.push(performance.now() - started); if (state.fleetMillis.length > 100) state.fleetMillis.shift();
        state.snapshotMillis.push(fleet.madeInSeconds * 1000); if (state.snapshotMillis.length > 100) state.snapshotMillis.shift();
        state.fleet = fleet; renderFleet(fleet);
      } catch (err) { $("workers-summary").textContent = "(could not read the fleet: " + err.message + ")"; }
    }
    function filterBody() {
      const body = {}; const user = $("dlq-user").value.trim(), model = $("dlq-model").value.trim(), reason = $("dlq-reason").value.trim();
      if (user) body.user = user; if (model) body.model = model; if (reason) body.reasonContains = reason;
      return body;
    }
    function describe(body) { const words = Object.entries(body).map(([k, v]) => k + " " + v); return words.length ? "matching " + words.join(", ") : "— every one of them"; }
    $("dlq-replay-matching").onclick = () => { const body = filterBody(); if (!Object.keys(body).length) body.all = true;
      act("/api/actions/dlq-replay", body, "Replay the dead letters " + describe(body) + "?"); };
    $("dlq-purge-matching").onclick = () => { const body = filterBody(); if (!Object.keys(body).length) body.all = true;
      act("/api/actions/dlq-purge", body, "Delete the dead letters " + describe(body) + " for good?"); };

    async function search(event) {
      if (event) event.preventDefault();
      const ids = $("search-ids").value.split(/[\s,]+/).filter(Boolean);
      const query = new URLSearchParams();
      if (ids.length) query.set("ids", ids.join(",")); else { query.set("user", $("search-user").value.trim()); if ($("search-model").value.trim()) query.set("model", $("search-model").value.trim()); }
      const body = $("search-results"); body.replaceChildren();
      try {
        const outcomes = (await api("/api/outcomes?" + query)).jobs;
        outcomes.forEach(o => {
          const row = body.insertRow(); row.dataset.job = o.jobId; row.dataset.state = o.state;
          cell(row, o.jobId); cell(row, o.userId); cell(row, o.model); cell(row, o.state, o.state); cell(row, o.reason, "reason");
          cell(row, o.version); cell(row, o.attempts); cell(row, o.worker); cell(row, o.updatedAt ? ago(o.updatedAt) : "");
          const actions = row.insertCell();
          if (o.state === "unknown" || o.state === "retrying") {
            const cancel = document.createElement("button"); cancel.className = "small cancel"; cancel.textContent = "cancel";
            cancel.onclick = async () => { if (await act("/api/actions/cancel", { jobId: o.jobId }, "Cancel job " + o.jobId + "?")) search(); };
            actions.append(cancel);
          }
        });
      } catch (err) { const row = body.insertRow(); cell(row, "refused: " + err.message); }
    }
    $("search-form").addEventListener("submit", search);
    async function loadAudit() {
      try {
        const actions = await api("/api/actions"); const body = $("audit"); body.replaceChildren();
        actions.forEach(a => { const row = body.insertRow(); row.dataset.action = a.action;
          cell(row, a.at); cell(row, a.operator); cell(row, a.source); cell(row, a.action); cell(row, a.target); cell(row, a.affected); });
      } catch (err) { /* the next load tries again */ }
    }
    async function loadRebases() {
      try {
        const rebases = await api("/api/rebases");
        const body = $("rebases"); body.replaceChildren();
        rebases.forEach(r => { const row = body.insertRow(); cell(row, r.id); cell(row, r.model); cell(row, r.baseVersion);
          cell(row, r.state + (r.reason ? " (" + r.reason + ")" : ""), r.state); cell(row, r.users);
          ["rebased", "moved", "stayed", "failed", "cancelled", "pending"].forEach(k => cell(row, r.outcomes[k] ?? 0)); });
      } catch (err) { /* the next poll tries again */ }
    }
    $("history-form").addEventListener("submit", async event => {
      event.preventDefault();
      const query = new URLSearchParams({ model: $("h-model").value, user: $("h-user").value });
      const versions = await api("/api/history?" + query);
      const body = $("history"); body.replaceChildren();
      versions.forEach(v => { const row = body.insertRow(); cell(row, v.version + (v.pruned ? " (pruned)" : "") + (v.rebasedFrom ? " (rebased from v" + v.rebasedFrom + ")" : "")); cell(row, v.baseVersion);
        cell(row, v.samples); cell(row, v.epochs); cell(row, v.loss != null ? v.loss.toFixed(4) : "—"); cell(row, v.jobId); cell(row, v.createdAt); });
    });
    async function loadRecent() {
      try { (await api("/api/outcomes")).jobs.forEach(fromOutcome); renderJobs(); } catch (err) { /* live events still come */ }
    }
    const source = new EventSource("/api/events");
    source.onopen = () => { $("status").textContent = "live"; };
    source.onerror = () => { $("status").textContent = "reconnecting…"; };
    source.onmessage = message => { onEvent(JSON.parse(message.data)); };
    setInterval(renderJobs, 1000); setInterval(loadFleet, 3000); setInterval(loadRebases, 10000); setInterval(loadAudit, 10000);
    loadSession(); loadRecent(); loadFleet(); loadRebases(); loadAudit();
    """#
}
