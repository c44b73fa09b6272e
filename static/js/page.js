// Where the page's state lives: the address bar on the web app; in an embedded explorer (the
// notebook widget, an exported HTML file) a query string held in memory, since such a document
// (about:srcdoc, file://) may not rewrite its own URL. Everything that reads or writes the URL's
// query goes through here.
const embedded = globalThis.ATTNSCOPE_EMBED || null; // { search: "?text=…&lang=zh" } when embedded

// a saved HTML file opened as run.html?lang=zh: the language asked for in its own address wins
if (embedded && embedded.offline && location.protocol === "file:") {
  const asked = new URLSearchParams(location.search).get("lang");
  if (asked) {
    const kept = new URLSearchParams(embedded.search || "");
    kept.set("lang", asked);
    embedded.search = `?${kept}`;
  }
}

export const isEmbedded = () => embedded !== null;

export function search() {
  return embedded ? embedded.search || "" : location.search;
}

export function setSearch(params) {
  const query = `?${params}`;
  if (embedded) {
    embedded.search = query;
    return;
  }
  history.replaceState(history.state, "", `${location.pathname}${query}`);
}
