// Runs inside an embedded explorer (the notebook widget's frame) before its modules: the page's
// fetch("/api/…") goes to the parent window as a message, and the answer streams back as the
// body of an ordinary Response, chunk by chunk (generation's Server-Sent Events included). A
// classic script, inlined by app/embed.py; anything not under "/" goes to the real fetch.
(() => {
  const realFetch = window.fetch.bind(window);
  const waiting = new Map(); // id -> { start, push, close, fail }
  let next = 0;
  const NO_BODY = new Set([101, 204, 205, 304]);

  window.addEventListener("message", (ev) => {
    const m = ev.data;
    if (ev.source !== window.parent || !m || m.type !== "attnscope-response") return;
    const w = waiting.get(m.id);
    if (!w) return; // aborted meanwhile
    if (m.start) w.start(m.status, m.headers);
    if (m.chunk) w.push(m.chunk);
    if (m.done) {
      waiting.delete(m.id);
      w.close();
    }
  });

  window.fetch = (input, init = {}) => {
    const url = typeof input === "string" ? input : input.url;
    if (!url.startsWith("/")) return realFetch(input, init);
    return new Promise((resolve, reject) => {
      const id = ++next;
      let controller = null;
      const stream = new ReadableStream({ start(c) { controller = c; } });
      waiting.set(id, {
        start: (status, headers) => resolve(new Response(NO_BODY.has(status) ? null : stream, { status, headers })),
        push: (bytes) => controller.enqueue(new Uint8Array(bytes)),
        close: () => { try { controller.close(); } catch { /* a null-body response has no reader */ } },
      });
      const signal = init.signal;
      if (signal) {
        const abort = () => {
          waiting.delete(id);
          const err = new DOMException("The request was aborted", "AbortError");
          try { controller.error(err); } catch { /* not started */ }
          reject(err);
        };
        if (signal.aborted) return abort();
        signal.addEventListener("abort", abort, { once: true });
      }
      const body = init.body == null ? null : typeof init.body === "string" ? new TextEncoder().encode(init.body).buffer : init.body;
      const headers = Object.fromEntries(new Headers(init.headers || {}));
      window.parent.postMessage({ type: "attnscope-request", id, method: (init.method || "GET").toUpperCase(), url, headers, body }, "*");
    });
  };
})();
