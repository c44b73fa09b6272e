// The causal tools under the explorer: one tab per view, each opened from the URL
// (?view=attribution|ablate|patch|lens|residual|compare|qk|survey) and redrawn when the run, the
// focused position or the selected head changes. Views live in their own modules.
import { el } from "../dom.js";
import { urlExtras } from "../state.js";
import { errorText, t } from "../i18n.js";
import { search, setSearch } from "../page.js";
import * as attribution from "./attribution.js";
import * as ablation from "./ablation.js";
import * as patching from "./patching.js";
import * as lens from "./lens.js";
import * as residual from "./residual.js";
import * as compare from "./compare.js";

const VIEWS = {
  attribution: { title: "Attribution", module: attribution, on: ["run", "pos"] },
  ablate: { title: "Ablate", module: ablation, on: ["run", "pos"] },
  patch: { title: "Patch", module: patching, on: ["run"] },
  lens: { title: "Logit lens", module: lens, on: ["run", "pos"] },
  residual: { title: "Residual", module: residual, on: ["run", "pos"] },
  compare: { title: "Compare a head", module: compare, on: ["run", "head"] },
  // views that need the server and its model, loaded when first opened (an offline HTML file leaves them out)
  qk: { title: "Why here?", load: () => import("./qk.js"), on: ["run", "pos", "head", "key"] },
  survey: { title: "Corpus", load: () => import("./survey.js"), on: ["run", "head"] },
};
// the URL parameters each view owns (kept in the shareable URL while it is open)
const OWN = { attribution: ["token"], ablate: ["ablate", "mode"], patch: ["clean", "corrupted", "answer", "wrong"], compare: ["compare"], survey: ["field"] };

export class Tools {
  constructor(root, { selectHead, error, prompt, setCorpus = () => {} }) {
    this.root = root;
    this.hooks = { selectHead, error, prompt, setCorpus };
    this.view = null;
    this.params = {};
    this.state = null;
    // WAI-ARIA tabs: one tab stop for the row (the open tab, else the first); Left/Right/Home/End
    // move between the tabs and open the one they reach; the body is the tabpanel they control
    this.tabs = el("div", { class: "tool-tabs", role: "tablist" });
    this.body = el("div", { class: "tool-body", id: "tool-panel", role: "tabpanel", "data-testid": "tool-body" });
    for (const [key, v] of Object.entries(VIEWS)) {
      this.tabs.append(el("button", { type: "button", role: "tab", id: `tool-tab-${key}`, "aria-controls": "tool-panel", "aria-selected": "false",
        tabindex: "-1", "data-view": key, "data-testid": `tool-tab-${key}`, text: v.title, onclick: () => this.open(key) }));
    }
    this.tabs.addEventListener("keydown", (ev) => this.arrows(ev));
    root.replaceChildren(this.tabs, this.body);
    this.intro = el("p", { class: "legend" });
    this.body.append(this.intro);
    this.labels();
    urlExtras.push(() => this.urlParams());
    const url = new URLSearchParams(search());
    const view = url.get("view");
    if (view && VIEWS[view]) {
      this.view = view;
      for (const k of OWN[view] || []) if (url.has(k)) this.params[k] = url.get(k);
    }
    this.mark();
  }

  // aria-selected, the roving tab stop and the panel's name follow the open view
  mark() {
    const tabs = [...this.tabs.children];
    const stop = tabs.find((b) => b.dataset.view === this.view) || tabs[0];
    for (const b of tabs) {
      b.setAttribute("aria-selected", String(b.dataset.view === this.view));
      b.tabIndex = b === stop ? 0 : -1;
    }
    if (this.view) this.body.setAttribute("aria-labelledby", `tool-tab-${this.view}`);
  }

  arrows(ev) {
    const tabs = [...this.tabs.children];
    const i = tabs.indexOf(ev.target);
    if (i < 0) return;
    const to = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 }[ev.key];
    if (to === undefined) return;
    ev.preventDefault();
    const tab = tabs[(to + tabs.length) % tabs.length];
    tab.focus();
    this.open(tab.dataset.view);
  }

  // the tab names and the introduction in the page's language
  labels() {
    for (const b of this.tabs.children) b.textContent = t(`x.tool.${b.dataset.view}`);
    this.tabs.setAttribute("aria-label", t("x.tool.tabs"));
    this.intro.textContent = t("x.tool.intro");
  }

  // extra URL parameters for state.js's toURL
  urlParams() {
    if (!this.view) return {};
    const own = Object.fromEntries((OWN[this.view] || []).filter((k) => this.params[k] !== undefined && this.params[k] !== "").map((k) => [k, this.params[k]]));
    return { view: this.view, ...own };
  }

  open(view) {
    if (this.view !== view) this.params = {};
    this.view = view;
    this.mark();
    this.draw();
  }

  // called by the explorer: what changed ("run", "pos", "head", "key": the selected cell) and the current state
  update(what, state) {
    this.state = state;
    this.root.hidden = false;
    if (this.view && VIEWS[this.view].on.includes(what)) this.draw();
  }

  async draw() {
    if (!this.view || !this.state || !this.state.run) return;
    this.mark();
    this.root.hidden = false;
    this.root.dataset.view = this.view;
    const { run, pos, key, layer, head, model } = this.state;
    this.syncURL();
    if (model && !model.has_lm_head && this.view !== "compare" && this.view !== "residual") {
      this.body.replaceChildren(el("p", { class: "legend", "data-testid": "tool-unavailable",
        text: t("x.tool.encoder", { model: run.model }) }));
      return;
    }
    const body = el("div", { class: "tool-view", "data-testid": `tool-view-${this.view}` });
    // the view's own error line (each view puts it by its button; else it leads the view): a refusal
    // is read where it was asked for, and the results of the earlier inputs are marked as such
    const alert = el("p", { class: "error tool-error", role: "alert", "data-testid": "tool-error" });
    alert.hidden = true;
    // `error`: what was thrown (a server refusal is said by its code: errorText), a string of the
    // page's own words, or "" to clear
    const fail = (error) => {
      const msg = error || "";
      const earlier = Boolean(msg) && body.querySelector(".chart .main-svg") !== null;
      const said = errorText(msg).trim();
      const stop = /[.!?。！？]$/.test(said) ? "" : /[\u2e80-\uffff]$/.test(said) ? "。" : ".";
      alert.textContent = msg ? said + (earlier ? `${stop} ${t("tool.stale")}` : "") : "";
      alert.hidden = !msg;
      body.classList.toggle("stale", earlier);
      body.dataset.stale = earlier ? "1" : "0";
      if (msg && !alert.isConnected) body.prepend(alert);
    };
    const ctx = {
      run, pos, key, layer, head, params: this.params, alert,
      selectHead: this.hooks.selectHead,
      setCorpus: this.hooks.setCorpus,
      error: fail,
      prompt: this.hooks.prompt,
      setParams: (p) => { Object.assign(this.params, p); this.syncURL(); },
    };
    this.body.replaceChildren(body);
    try {
      const view = VIEWS[this.view];
      let module = view.module;
      if (!module) {
        try {
          module = view.module = await view.load();
        } catch {
          fail(t("err.offline_file")); // not in this file: an offline copy holds only what was saved
          return;
        }
      }
      await module.render(body, ctx);
    } catch (err) {
      fail(err);
    }
  }

  syncURL() {
    const url = new URLSearchParams(search());
    for (const keys of Object.values(OWN)) for (const k of keys) url.delete(k);
    url.delete("view");
    for (const [k, v] of Object.entries(this.urlParams())) url.set(k, v);
    setSearch(url);
  }
}
