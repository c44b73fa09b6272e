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
    if (!msg || msg.type !== "response" || !frame.contentWindow) return;
    const view = buffers && buffers.length ? buffers[0] : null;
    const chunk = view ? view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength) : null;
    frame.contentWindow.postMessage({ type: "attnscope-response", id: msg.id, start: msg.start, status: msg.status,
                                      headers: msg.headers, done: msg.done, chunk }, "*", chunk ? [chunk] : []);
  };
  window.addEventListener("message", onRequest);
  model.on("msg:custom", onAnswer);
  const load = () => { frame.srcdoc = model.get("html"); };
  model.on("change:html", load);
  load();
  return () => {
    window.removeEventListener("message", onRequest);
    model.off("msg:custom", onAnswer);
    model.off("change:html", load);
  };
}

export default { render };
