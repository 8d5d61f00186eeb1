import AttuneQueue
import AttuneStore
import Foundation
import Hummingbird
import ServiceLifecycle

/// The operators' page at `/` of `attune serve`'s admin listener, as Flower is for Celery: jobs in flight and finished, live
/// from `attune.events` over server-sent events, each job's loss per epoch drawn with Chart.js (Debian's
/// libjs-chart.js, served beside the page), throughput over time, the dead-letter queue with its reasons,
/// the rebases' progress, and a user's version history.

enum Dashboard {
    static func add(to router: Router<some RequestContext>, hub: EventHub, delivery: ModelDelivery, amqpURL: String,
                    chartJS: String) {
        router.get("/") { _, _ in
            Response(status: .ok, headers: [.contentType: "text/html; charset=utf-8"],
                     body: .init(byteBuffer: ByteBuffer(string: page)))
        }
        router.get("dashboard/app.js") { _, _ in
            Response(status: .ok, headers: [.contentType: "text/javascript; charset=utf-8"],
                     body: .init(byteBuffer: ByteBuffer(string: script)))
        }
        router.get("dashboard/app.css") { _, _ in
            Response(status: .ok, headers: [.contentType: "text/css; charset=utf-8"],
                     body: .init(byteBuffer: ByteBuffer(string: style)))
        }
        router.get("dashboard/chart.js") { _, _ -> Response in
            guard let script = FileManager.default.contents(atPath: chartJS) else {
                return Response(status: .notFound, body: .init(byteBuffer: ByteBuffer(
                    string: "no Chart.js at \(chartJS): apt-get install libjs-chart.js, or pass --chart-js\n")))
            }
            return Response(status: .ok, headers: [.contentType: "text/javascript", .cacheControl: "max-age=3600"],
                            body: .init(byteBuffer: ByteBuffer(bytes: script)))
        }
        router.get("api/events") { _, _ -> Response in
            let (lines, end) = hub.stream()
            return Response(status: .ok, headers: [.contentType: "text/event-stream", .cacheControl: "no-cache"],
                            body: .init { writer in
                                // Ends when the page goes (a write fails) or the server shuts down.
                                try await withGracefulShutdownHandler {
                                    for await line in lines {
                                        try await writer.write(ByteBuffer(string: line.isEmpty ? ": keepalive\n\n" : "data: \(line)\n\n"))
                                    }
                                } onGracefulShutdown: {
                                    end()
                                }
                                try await writer.finish(nil)
                            })
        }
        router.get("api/dead-letters") { _, _ -> Response in
            let letters: [[String: Any]] = try await onThread {
                try DeadLetterQueue(url: amqpURL).list(limit: 200).map { letter in
                    var row: [String: Any] = ["jobId": letter.jobId, "userId": letter.userId, "model": letter.model,
                                              "reason": letter.reason]
                    if let attempts = letter.attempts { row["attempts"] = attempts }
                    if let at = letter.deadLetteredAt { row["deadLetteredAt"] = ISO8601DateFormatter().string(from: at) }
                    return row
                }
            }
            return json(letters)
        }
        router.get("api/history") { request, _ -> Response in
            guard let model = request.uri.queryParameters.get("model"), let user = request.uri.queryParameters.get("user")
            else { return Response(status: .badRequest, body: .init(byteBuffer: ByteBuffer(string: "model and user, please\n"))) }
            let versions: Data = try await delivery.withRegistry { registry in
                jsonData(try registry.history(user: user, model: model).map { v in
                    var row: [String: Any] = ["version": v.version, "baseVersion": v.baseVersion, "jobId": v.jobId,
                                              "samples": v.samples, "epochs": v.epochs, "worker": v.worker,
                                              "createdAt": ISO8601DateFormatter().string(from: v.createdAt)]
                    if let loss = v.loss, loss.isFinite { row["loss"] = loss }
                    if v.prunedAt != nil { row["pruned"] = true }
                    if let restored = v.restoredFrom { row["restoredFrom"] = restored }
                    if let rebased = v.rebasedFrom { row["rebasedFrom"] = rebased }
                    return row
                })
            }
            return json(versions)
        }
        router.get("api/rebases") { _, _ -> Response in
            let rebases: Data = try await delivery.withRegistry { registry in
                jsonData(try registry.recentRebases(limit: 20).map { r in
                    var row: [String: Any] = ["id": r.id, "model": r.model, "baseVersion": r.baseVersion, "state": r.state.rawValue,
                                              "users": r.users, "outcomes": r.outcomes,
                                              "startedAt": ISO8601DateFormatter().string(from: r.startedAt)]
                    if let reason = r.reason { row["reason"] = reason }
                    return row
                })
            }
            return json(rebases)
        }
    }

    static func json(_ rows: [[String: Any]]) -> Response { json(jsonData(rows)) }

    /// Rows as JSON, made where they are read (a registry's thread hands back bytes, which are Sendable).
    static func jsonData(_ rows: [[String: Any]]) -> Data {
        (try? JSONSerialization.data(withJSONObject: rows, options: [.sortedKeys])) ?? Data("[]".utf8)
    }

    static func json(_ data: Data) -> Response {
        Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// rabbitmq-c blocks: the dead-letter listing runs on a thread of its own.
    static func onThread<T>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        // The result is made on the thread and handed over by the continuation (`sending`), never shared.
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<T, Error>) in
            Thread {
                do { done.resume(returning: try body()) } catch { done.resume(throwing: error) }
            }.start()
        }
    }

    static let page = #"""
    <!doctype html>
    <html lang="en"><head><meta charset="utf-8"><title>Attune</title>
    <link rel="stylesheet" href="/dashboard/app.css"></head>
    <body>
    <h1>Attune <small id="status">connecting…</small></h1>
    <h2>Throughput (jobs completed per 5 s)</h2>
    <div class="throughput"><canvas id="throughput"></canvas></div>
    <h2>Jobs</h2>
    <table><thead><tr><th>job</th><th>user</th><th>model</th><th>state</th><th>epoch</th><th>loss</th><th>version</th></tr></thead>
    <tbody id="jobs"></tbody></table>
    <h2>Loss per epoch</h2>
    <div class="charts" id="charts"></div>
    <h2>Dead-letter queue</h2>
    <table><thead><tr><th>job</th><th>user</th><th>model</th><th>attempts</th><th>reason</th></tr></thead><tbody id="dlq"></tbody></table>
    <h2>Rebases</h2>
    <table><thead><tr><th>rebase</th><th>model</th><th>onto base</th><th>state</th><th>users</th><th>rebased</th><th>moved</th><th>stayed</th><th>failed</th><th>cancelled</th><th>to come</th></tr></thead><tbody id="rebases"></tbody></table>
    <h2>A user's versions</h2>
    <form id="history-form">model <input id="h-model" size="12"> user <input id="h-user" size="12"> <button>show</button></form>
    <table><thead><tr><th>version</th><th>base</th><th>samples</th><th>epochs</th><th>loss</th><th>job</th><th>when</th></tr></thead>
    <tbody id="history"></tbody></table>
    <script src="/dashboard/chart.js"></script>
    <script src="/dashboard/app.js"></script></body></html>
    """#

    static let style = #"""
      body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
      h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
      table { border-collapse: collapse; } td, th { padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: left; }
      .charts { display: flex; flex-wrap: wrap; gap: 12px; } .job { width: 300px; border: 1px solid #ddd; padding: 6px; }
      .job h3 { font-size: 12px; margin: 0 0 4px; font-weight: normal; } .failed { color: #b00; } .completed { color: #070; }
      .throughput { width: 620px; height: 160px; }
    """#

    static let script = #"""
    const jobs = new Map(), charts = new Map(), buckets = new Map();
    window.attuneDashboard = { jobs, charts };
    const cell = (row, text, cls) => { const td = row.insertCell(); td.textContent = text ?? ""; if (cls) td.className = cls; };
    const throughput = new Chart(document.getElementById("throughput"), {
      type: "line", data: { labels: [], datasets: [{ label: "completed", data: [], borderColor: "#36c", tension: 0.2 }] },
      options: { animation: false, maintainAspectRatio: false, plugins: { legend: { display: false } },
                 scales: { y: { beginAtZero: true, suggestedMax: 1 } } } });
    function chartFor(job) {
      if (charts.has(job.id)) return charts.get(job.id);
      const box = document.createElement("div"); box.className = "job"; box.dataset.job = job.id;
      const title = document.createElement("h3"); title.textContent = job.id + " · " + job.user; box.appendChild(title);
      const canvas = document.createElement("canvas"); canvas.width = 280; canvas.height = 140; box.appendChild(canvas);
      const container = document.getElementById("charts"); container.insertBefore(box, container.firstChild);
      while (container.children.length > 24) { const last = container.lastChild; charts.delete(last.dataset.job); last.remove(); }
      const chart = new Chart(canvas, { type: "line", data: { labels: [], datasets: [
          { label: "loss", data: [], borderColor: "#c33", yAxisID: "y" },
          { label: "validation accuracy", data: [], borderColor: "#393", yAxisID: "y1", hidden: true } ] },
        options: { animation: false, responsive: false, scales: { y: { position: "left" }, y1: { position: "right", min: 0, max: 1 } } } });
      charts.set(job.id, chart); return chart;
    }
    function render() {
      const body = document.getElementById("jobs"); body.replaceChildren();
      [...jobs.values()].sort((a, b) => b.updated - a.updated).slice(0, 50).forEach(job => {
        const row = body.insertRow();
        cell(row, job.id); cell(row, job.user); cell(row, job.model); cell(row, job.state, job.state);
        cell(row, job.epochs ? job.epoch + "/" + job.epochs : ""); cell(row, job.loss != null ? job.loss.toFixed(4) : "");
        cell(row, job.version ?? "");
      });
    }
    function onEvent(e) {
      if (!e.jobId) return;
      const job = jobs.get(e.jobId) ?? { id: e.jobId, user: e.userId ?? "~", model: e.model ?? "~", state: "queued", epoch: 0 };
      jobs.set(e.jobId, job); job.updated = Date.now();
      switch (e.kind) {
        case "TRAINING_BEGIN": job.state = "training"; job.epochs = Number(e.epochs ?? 0); break;
        case "EPOCH_END": {
          job.state = "training"; job.epoch = Number(e.epoch); job.epochs = Number(e.epochs ?? job.epochs); job.loss = e.loss;
          const chart = chartFor(job); chart.data.labels.push(job.epoch); chart.data.datasets[0].data.push(e.loss ?? null);
          if (e.validationAccuracy != null) { chart.data.datasets[1].hidden = false; chart.data.datasets[1].data.push(e.validationAccuracy); }
          chart.update(); break; }
        case "COMPLETED": {
          job.state = "completed"; job.version = e.version; if (e.loss != null) job.loss = e.loss;
          const bucket = Math.floor(Date.now() / 5000) * 5000; buckets.set(bucket, (buckets.get(bucket) ?? 0) + 1);
          drawThroughput(); break; }
        case "FAILED": job.state = e.willRetry ? "retrying" : "failed"; job.reason = e.reason; break;
        case "CANCELLED": job.state = "cancelled"; break;
        case "HELD": job.state = "held"; job.version = e.version; job.reason = e.reason; break;
      }
    }
    function drawThroughput() {
      const now = Math.floor(Date.now() / 5000) * 5000, labels = [], data = [];
      for (let t = now - 5000 * 59; t <= now; t += 5000) { labels.push(new Date(t).toLocaleTimeString()); data.push(buckets.get(t) ?? 0); }
      throughput.data.labels = labels; throughput.data.datasets[0].data = data; throughput.update();
    }
    async function loadDeadLetters() {
      try {
        const letters = await (await fetch("/api/dead-letters")).json();
        const body = document.getElementById("dlq"); body.replaceChildren();
        letters.forEach(l => { const row = body.insertRow(); cell(row, l.jobId); cell(row, l.userId); cell(row, l.model); cell(row, l.attempts); cell(row, l.reason); });
      } catch (err) { /* the next poll tries again */ }
    }
    async function loadRebases() {
      try {
        const rebases = await (await fetch("/api/rebases")).json();
        const body = document.getElementById("rebases"); body.replaceChildren();
        rebases.forEach(r => { const row = body.insertRow(); cell(row, r.id); cell(row, r.model); cell(row, r.baseVersion);
          cell(row, r.state + (r.reason ? " (" + r.reason + ")" : ""), r.state); cell(row, r.users);
          ["rebased", "moved", "stayed", "failed", "cancelled", "pending"].forEach(k => cell(row, r.outcomes[k] ?? 0)); });
      } catch (err) { /* the next poll tries again */ }
    }
    document.getElementById("history-form").addEventListener("submit", async event => {
      event.preventDefault();
      const query = new URLSearchParams({ model: document.getElementById("h-model").value, user: document.getElementById("h-user").value });
      const versions = await (await fetch("/api/history?" + query)).json();
      const body = document.getElementById("history"); body.replaceChildren();
      versions.forEach(v => { const row = body.insertRow(); cell(row, v.version + (v.pruned ? " (pruned)" : "") + (v.rebasedFrom ? " (rebased from v" + v.rebasedFrom + ")" : "")); cell(row, v.baseVersion);
        cell(row, v.samples); cell(row, v.epochs); cell(row, v.loss != null ? v.loss.toFixed(4) : "—"); cell(row, v.jobId); cell(row, v.createdAt); });
    });
    const source = new EventSource("/api/events");
    source.onopen = () => { document.getElementById("status").textContent = "live"; };
    source.onerror = () => { document.getElementById("status").textContent = "reconnecting…"; };
    source.onmessage = message => { onEvent(JSON.parse(message.data)); };
    setInterval(render, 500); setInterval(drawThroughput, 2000); setInterval(loadDeadLetters, 10000);
    setInterval(loadRebases, 5000);
    loadDeadLetters(); loadRebases(); drawThroughput();
    """#
}
