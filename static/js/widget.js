// The notebook widget (anywidget): the explorer's own page in a frame, its /api requests carried
// over the widget's comm to the kernel (app/notebook.py), which answers them with the same routes
// and services as the web app, on the model object the notebook holds. No port, no CDN.
function render({ model, el }) {
  el.dataset.testid = "attnscope-widget";
  const frame = document.createElement("iframe");
  frame.title = "attnscope";
  frame.dataset.testid = "attnscope-frame";
  frame.style.cssText = `width:100%;height:${model.get("height")}px;border:1px solid #ddd;border-radius:4px;background:#fff`;
  el.replaceChildren(frame);

  // the frame's fetch -> a custom message to the kernel (the body as a binary buffer)
  const onRequest = (ev) => {
    const m = ev.data;
    if (ev.source !== frame.contentWindow || !m || m.type !== "attnscope-request") return;
    const content = { type: "request", id: m.id, method: m.method, url: m.url, headers: m.headers };
    model.send(content, null, m.body ? [m.body] : []);
  };
  // the kernel's answer -> the frame (status and headers first, then the body in chunks)
  const onAnswer = (msg, buffers) => {
    const view = buffers && buffers.length ? buffers[0] : null;
    if (msg && msg.type === "page" && view) {  // the page itself, asked for below
      frame.srcdoc = new TextDecoder().decode(view);
      return;
    }
    if (!msg || msg.type !== "response" || !frame.contentWindow) return;
    const chunk = view ? view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength) : null;
    frame.contentWindow.postMessage({ type: "attnscope-response", id: msg.id, start: msg.start, status: msg.status,
                                      headers: msg.headers, done: msg.done, chunk }, "*", chunk ? [chunk] : []);
  };
  window.addEventListener("message", onRequest);
  model.on("msg:custom", onAnswer);
  // the page (the web app's own, 5 MB with plotly.js) comes from the kernel when a view is drawn: it is
  // not a synced trait, so a saved notebook does not carry it
  const load = () => { frame.style.height = `${model.get("height")}px`; model.send({ type: "page" }); };
  model.on("change:query", load);
  model.on("change:height", load);
  load();
  return () => {
    window.removeEventListener("message", onRequest);
    model.off("msg:custom", onAnswer);
    model.off("change:query", load);
    model.off("change:height", load);
  };
}

export default { render };
