// One small store for the explorer's state; views subscribe to what they draw.

const listeners = new Set();

export const state = {
  models: [],
  model: null, // the ModelOut of the current run's model
  run: null, // the RunOut of POST /api/runs
  layer: 0,
  head: 0,
  pos: 0, // selected query position
  temperature: 1,
  colour: "linear",
  slice: null, // binary attention of the selected head
};

export function set(patch) {
  Object.assign(state, patch);
  for (const fn of listeners) fn(patch);
}

export function subscribe(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

// more URL parameters, from views that own some (the causal tools: view=..., their inputs)
export const urlExtras = [];

// The view's state as a shareable URL: /?text=...&model=...&layer=L&head=H&pos=P
export function toURL() {
  if (!state.run) return;
  const params = new URLSearchParams({
    text: document.getElementById("prompt").value,
    model: state.run.model,
    layer: state.layer,
    head: state.head,
    pos: state.pos,
  });
  for (const extra of urlExtras) for (const [k, v] of Object.entries(extra())) params.set(k, v);
  history.replaceState(null, "", `${location.pathname}?${params}`);
}
