'use strict';
// orchestrator console: the page. What the server sends is data, never markup (a task name,
// tool arguments or a reason may hold HTML): the DOM is built with createElement/textContent only.
// The DOM contract (data-testid names) is docs/design/console.md; a browser test relies on it.

const HEADERS = {'Content-Type': 'application/json', 'X-Orchestrator-Console': '1'};
const TERMINAL = new Set(['Succeeded', 'Failed', 'Cancelled']);
const TITLE = 'orchestrator console';
// Characters a reader would not see or that reorder text: C0 (but \t and \n) and C1 controls,
// bidi embeddings/overrides/isolates, zero-width and invisible formatting (as the CLI's visible()).
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]/g;

const $ = (id) => document.getElementById(id);
const state = {
  session: null,
  tasks: new Map(),   // 'ns/name' -> TaskView
  loaded: false,      // a snapshot has arrived
  selected: null,     // 'ns/name' from location.hash
  seen: new Set(),    // 'ns/name/id' of approvals already announced
  access: new Map(),  // ns -> {data, at, loading}: what the caller may do there (/access)
  filter: '',         // the task list's filter text
  tab: 'overview',    // the detail's tab: overview | logs
};
// How long an answer of /access is used before it is asked again.
const ACCESS_TTL_MS = 30000;
const rows = new Map();  // 'ns/name' -> <tr>, updated in place so focus survives renders
let detail = null;       // the rendered detail's elements (buildDetail)
let uid = 0;             // for unique element ids (label for=)

// ---- small helpers -------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) node.append(c);
  return node;
}

// `text` as nodes, every hidden character shown as a marked `\u{…}` (the CLI writes the same).
function visible(text) {
  const frag = document.createDocumentFragment();
  const s = String(text);
  let last = 0;
  for (const m of s.matchAll(HIDDEN)) {
    if (m.index > last) frag.append(s.slice(last, m.index));
    frag.append(el('span', {class: 'hidden-char', title: 'invisible or control character'},
      `\\u{${m[0].codePointAt(0).toString(16)}}`));
    last = m.index + m[0].length;
  }
  if (last < s.length) frag.append(s.slice(last));
  return frag;
}

const keyOf = (t) => `${t.namespace}/${t.name}`;
const isPending = (a) => String(a.state).toLowerCase() === 'pending';
const pendingOf = (t) => (t.approvals || []).filter(isPending);
const taskUrl = (ns, name) =>
  `/api/namespaces/${encodeURIComponent(ns)}/tasks/${encodeURIComponent(name)}`;
const orDash = (v) => (v === null || v === undefined || v === '' ? '—' : String(v));
const list = (v) => (Array.isArray(v) ? v.join(', ') : orDash(v));

function splitKey(key) {
  const i = key.indexOf('/');
  return [key.slice(0, i), key.slice(i + 1)];
}

// An answer as {ok, data, text}: text is the `message`, or `<status> <reason>: <error>`.
async function answer(resp) {
  let data = null;
  try { data = await resp.json(); } catch (_) { /* not JSON: described below */ }
  if (resp.ok) return {ok: true, data, text: (data && data.message) || ''};
  const status = (data && data.status) || resp.status;
  const reason = (data && data.reason) || resp.statusText;
  const error = (data && data.error) || 'the console sent no error text';
  return {ok: false, data, text: `${status} ${reason}: ${error}`};
}

async function request(url, body) {
  const init = {credentials: 'same-origin'};
  if (body !== undefined) Object.assign(init, {method: 'POST', headers: HEADERS, body: JSON.stringify(body)});
  try {
    return await answer(await fetch(url, init));
  } catch (e) {
    return {ok: false, data: null, text: `the console did not answer: ${e.message}`};
  }
}

function showResult(node, res) {
  node.textContent = res.text;
  node.dataset.ok = String(res.ok);
}

// Replaces `parent`'s children with `nodes` only when the order differs, and gives the focus
// (and caret) back if moving nodes took it away.
function syncChildren(parent, nodes) {
  const kids = parent.children;
  if (kids.length === nodes.length && nodes.every((n, i) => kids[i] === n)) return;
  const active = document.activeElement;
  const caret = active && 'selectionStart' in active ? [active.selectionStart, active.selectionEnd] : null;
  parent.replaceChildren(...nodes);
  if (active && active.isConnected && document.activeElement !== active) {
    active.focus({preventScroll: true});
    if (caret) try { active.setSelectionRange(caret[0], caret[1]); } catch (_) { /* not a text input */ }
  }
}

function table(caption, headers, bodyRows) {
  return el('table', {class: 'small'},
    el('caption', {class: 'visually-hidden'}, caption),
    el('thead', null, el('tr', null, headers.map((h) => el('th', {scope: 'col'}, h)))),
    el('tbody', null, bodyRows));
}

// Every field of an object (result, cancellation) as a definition list.
function dl(obj) {
  return el('dl', {class: 'fields'}, Object.entries(obj).map(([k, v]) => [
    el('dt', null, k),
    el('dd', {class: 'text'}, visible(typeof v === 'object' && v !== null ? JSON.stringify(v, null, 2) : String(v))),
  ]));
}

// How long ago (or until) `iso`, in words: `12 s ago`, `3 min ago`, `2 h ago`, `in 4 min`.
function ago(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return String(iso);
  const ms = Date.now() - t, s = Math.round(Math.abs(ms) / 1000);
  const span = s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min` : s < 86400
    ? `${Math.floor(s / 3600)} h` : `${Math.floor(s / 86400)} d`;
  return ms >= -1000 ? `${span} ago` : `in ${span}`;
}

// A relative time, the absolute one in its title and datetime (the 1 s tick keeps it current).
function timeEl(iso, testid) {
  if (iso === null || iso === undefined || iso === '') return document.createTextNode('—');
  return el('time', {class: 'rel', datetime: iso, title: iso, 'data-at': iso, 'data-testid': testid}, ago(iso));
}

function countdown(expiresAt) {
  const ms = Date.parse(expiresAt) - Date.now();
  if (Number.isNaN(ms)) return `expires at ${expiresAt}`;
  if (ms <= 0) return 'expired';
  const s = Math.ceil(ms / 1000);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return `expires in ${h ? `${h}h${m}m${r}s` : m ? `${m}m${r}s` : `${r}s`}`;
}

// ---- live events -----------------------------------------------------------------------------

function connect() {
  const es = new EventSource('/api/events');
  const on = (name, fn) => es.addEventListener(name, (e) => {
    let data;
    try { data = JSON.parse(e.data); } catch (_) { return; }
    fn(data);
  });
  es.addEventListener('open', () => { $('connection').textContent = 'live'; });
  es.addEventListener('error', () => {
    $('connection').textContent = 'reconnecting…';
    // EventSource retries by itself, except after an error answer (e.g. 401): then it is CLOSED.
    if (es.readyState === EventSource.CLOSED) setTimeout(connect, 5000);
  });
  on('snapshot', (d) => {
    state.tasks.clear();
    for (const t of d.tasks || []) state.tasks.set(keyOf(t), t);
    state.loaded = true;
    $('problem').hidden = true;
    announce(d.tasks || []);
    render();
  });
  on('task', (t) => {
    state.tasks.set(keyOf(t), t);
    announce([t]);
    render();
  });
  on('deleted', (d) => {
    state.tasks.delete(`${d.namespace}/${d.name}`);
    render();
  });
  on('problem', (d) => {
    $('problem').textContent = `The task watch failed (retrying): ${d.error}`;
    $('problem').hidden = false;
  });
}

// A notice for every pending approval not seen before; on the first snapshot that includes
// those already waiting, so a person opening the page sees that something waits.
function announce(tasks) {
  for (const t of tasks) {
    for (const a of pendingOf(t)) {
      const id = `${keyOf(t)}/${a.id}`;
      if (state.seen.has(id)) continue;
      state.seen.add(id);
      setNotice(t, a);
      if ('Notification' in window && Notification.permission === 'granted') {
        try {
          new Notification('Call waiting for approval', {body: `${keyOf(t)}: ${a.server}/${a.tool}`, tag: id});
        } catch (_) { /* some browsers only notify from a service worker; the notice is there */ }
      }
    }
  }
}

// The banner names one waiting call (the newest announced) and how many more wait.
function setNotice(t, a) {
  const notice = $('notice');
  notice.dataset.id = `${keyOf(t)}/${a.id}`;
  notice.textContent = `Call waiting for approval: ${keyOf(t)} ${a.server}/${a.tool}`;
  updateNoticeCount();
}

// After every change: the banner goes when nothing waits, and moves on to another waiting call
// when the one it named was decided (or expired, or went with its task).
function refreshNotice() {
  const waiting = [];
  for (const t of state.tasks.values()) for (const a of pendingOf(t)) waiting.push([t, a]);
  const notice = $('notice');
  if (!waiting.length) {
    notice.textContent = '';
    delete notice.dataset.id;
    return;
  }
  if (!waiting.some(([t, a]) => `${keyOf(t)}/${a.id}` === notice.dataset.id)) {
    waiting.sort(([, x], [, y]) => String(y.requestedAt).localeCompare(String(x.requestedAt)));
    setNotice(...waiting[0]);
  }
  updateNoticeCount();
}

function updateNoticeCount() {
  const notice = $('notice');
  const n = [...state.tasks.values()].reduce((k, t) => k + pendingOf(t).length, 0);
  const base = notice.textContent.replace(/ \(\d+ calls wait\)$/, '');
  notice.textContent = n > 1 ? `${base} (${n} calls wait)` : base;
}

function setupNotifications() {
  const button = $('enable-notifications');
  const update = () => {
    const supported = 'Notification' in window;
    button.hidden = !supported || Notification.permission === 'granted';
    if (supported && Notification.permission === 'denied') {
      button.disabled = true;
      button.textContent = 'Notifications blocked by the browser';
    }
  };
  button.addEventListener('click', () => {
    Promise.resolve(Notification.requestPermission()).then(update, update);
  });
  update();
}

// ---- rendering -------------------------------------------------------------------------------

function render() {
  renderList();
  renderDetail();
  refreshNotice();
  const waiting = [...state.tasks.values()].reduce((n, t) => n + pendingOf(t).length, 0);
  document.title = waiting ? `(${waiting}) ${TITLE}` : TITLE;
}

function sortedTasks() {
  const time = (t) => Date.parse(t.createdAt) || 0;
  const cmp = (x, y) => (x < y ? -1 : x > y ? 1 : 0);  // code-unit order, as the CLI sorts names
  return [...state.tasks.values()].sort((a, b) =>
    time(b) - time(a) || cmp(a.name, b.name) || cmp(a.namespace, b.namespace));
}

function renderList() {
  const all = state.session && state.session.allNamespaces;
  const nodes = sortedTasks().map((t) => {
    const key = keyOf(t);
    let tr = rows.get(key);
    if (!tr) {
      const cells = ['name', 'phase', 'age', 'context', 'result', 'pending'].map((f) => el('td', {'data-field': f}));
      tr = el('tr', {'data-testid': 'task-row', 'data-namespace': t.namespace, 'data-name': t.name,
        tabindex: 0, class: 'task-row'}, cells);
      tr.addEventListener('click', () => select(key));
      tr.addEventListener('keydown', (e) => {
        if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); select(key); }
      });
      rows.set(key, tr);
    }
    const cell = (f) => tr.querySelector(`[data-field="${f}"]`);
    const waiting = pendingOf(t).length;
    cell('name').textContent = all ? key : t.name;
    cell('phase').textContent = orDash(t.phase);
    if (cell('age').dataset.at !== String(t.createdAt)) {
      cell('age').dataset.at = String(t.createdAt);
      cell('age').replaceChildren(timeEl(t.createdAt));
    }
    cell('context').textContent = `${orDash(t.servedContextVersion)}/${orDash(t.contextVersion)}`;
    cell('result').replaceChildren(visible(t.resultLine || ''));
    cell('pending').textContent = String(waiting);
    cell('pending').classList.toggle('waiting', waiting > 0);
    tr.setAttribute('aria-label', `${key}, ${orDash(t.phase)}${waiting ? `, ${waiting} waiting` : ''}`);
    if (key === state.selected) tr.setAttribute('aria-current', 'true');
    else tr.removeAttribute('aria-current');
    tr.hidden = !matches(t);
    return tr;
  });
  for (const key of rows.keys()) if (!state.tasks.has(key)) rows.delete(key);
  syncChildren($('task-rows'), nodes);
  const shown = nodes.filter((n) => !n.hidden).length;
  $('task-empty').hidden = shown > 0;
  $('task-empty').textContent = !state.loaded ? 'Loading…' : nodes.length ? `No task matches “${state.filter}”.` : 'No tasks.';
  $('task-filter-count').textContent = state.filter.trim() && nodes.length ? `${shown} of ${nodes.length} tasks shown` : '';
}

// The list's filter: every word typed must be in the row's namespace/name, phase, result,
// service or task id (case does not matter).
function matches(t) {
  const words = state.filter.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return true;
  const text = [keyOf(t), t.phase, t.resultLine, t.service, t.taskId].map((v) => String(v ?? '')).join(' ').toLowerCase();
  return words.every((w) => text.includes(w));
}

function select(key) {
  const [ns, name] = splitKey(key);
  location.hash = `#${encodeURIComponent(ns)}/${encodeURIComponent(name)}`;
}

function readHash() {
  const h = location.hash.slice(1);
  const i = h.indexOf('/');
  if (i < 1) return null;
  try { return `${decodeURIComponent(h.slice(0, i))}/${decodeURIComponent(h.slice(i + 1))}`; }
  catch (_) { return null; }
}

function renderDetail() {
  const pane = $('detail-pane');
  const t = state.selected && state.tasks.get(state.selected);
  if (!t) {
    if (detail) { clearTimeout(detail.auditTimer); clearTimeout(detail.logsTimer); }
    detail = null;
    const text = !state.selected ? 'Select a task in the list to see it here.'
      : state.loaded ? `Task ${state.selected} is not in the list (deleted, or not visible to you).`
        : 'Loading…';
    pane.replaceChildren(el('p', {class: 'empty'}, text));
    return;
  }
  if (!detail || detail.key !== state.selected) {
    if (detail) { clearTimeout(detail.auditTimer); clearTimeout(detail.logsTimer); }
    detail = buildDetail(t);
    pane.replaceChildren(detail.section);
    showTab(state.tab, false);
    loadAccess(t.namespace, false);
    loadAudit();
  }
  fillDetail(t);
}

// The parts of the detail that hold what a person types or was told (inputs, messages) are built
// once per selected task; fillDetail updates the rest on every event.
function buildDetail(t) {
  const d = {key: keyOf(t), ns: t.namespace, name: t.name, approvals: new Map(), auditSeq: 0};
  const field = (label, testid) => {
    const dd = el('dd', {'data-testid': testid, class: 'text'});
    return [el('dt', null, label), dd];
  };
  const summary = [
    ['Phase', 'detail-phase'], ['Result', 'detail-result'], ['Model usage (counted by the proxy)', 'detail-usage'],
    ['Context (served/rendered)', null], ['Created', null], ['Service', null], ['Task id', null], ['Prompt', null],
  ].map(([label, testid]) => field(label, testid));
  [d.phase, d.result, d.usage, d.context, d.created, d.service, d.taskId, d.prompt] = summary.map((f) => f[1]);

  const cancelPermissionId = `cancel-permission-${++uid}`, contextPermissionId = `context-permission-${uid}`;
  d.cancel = el('button', {type: 'button', 'data-testid': 'cancel', class: 'danger', 'aria-describedby': cancelPermissionId},
    'Cancel task');
  d.cancelMessage = el('p', {'data-testid': 'cancel-message', role: 'status', class: 'message'});
  d.cancelPermission = el('p', {id: cancelPermissionId, 'data-testid': 'cancel-permission', class: 'permission'});
  d.cancel.addEventListener('click', () => onCancel(d));

  d.approvalList = el('div', {class: 'approvals'});
  d.noApprovals = el('p', {class: 'empty'}, 'No calls asked for approval.');
  d.resultBox = el('div');
  d.cancellationBox = el('div');
  d.toolsSource = el('span', {'data-testid': 'tools-source'});
  d.toolLines = el('ul', {class: 'tool-lines'});
  d.servers = el('div');
  d.history = el('div');
  d.conditions = el('div');

  const enableId = `enable-${++uid}`, disableId = `disable-${uid}`, budgetId = `budget-${uid}`;
  d.enable = el('input', {id: enableId, 'data-testid': 'enable-tools', list: 'tool-options', autocomplete: 'off',
    placeholder: 'server:tool, server:tool'});
  d.disable = el('input', {id: disableId, 'data-testid': 'disable-tools', list: 'tool-options', autocomplete: 'off',
    placeholder: 'server:tool'});
  d.budget = el('input', {id: budgetId, 'data-testid': 'budget', autocomplete: 'off',
    placeholder: 'outputTokens=200000, costUsd=5, wallTimeSeconds=none'});
  d.contextSubmit = el('button', {type: 'submit', 'data-testid': 'context-submit', 'aria-describedby': contextPermissionId},
    'Change tools and budget');
  d.contextPermission = el('p', {id: contextPermissionId, 'data-testid': 'context-permission', class: 'permission'});
  d.contextMessage = el('p', {'data-testid': 'context-message', role: 'status', class: 'message'});
  d.contextReport = el('ul', {class: 'report'});
  const form = el('form', {'data-testid': 'context-form', class: 'context-form'},
    el('p', {class: 'hint'}, 'Comma- or space-separated server:tool names (server:* for all of a server).'),
    el('div', {class: 'row'}, el('label', {for: enableId}, 'Enable tools'), d.enable),
    el('div', {class: 'row'}, el('label', {for: disableId}, 'Disable tools'), d.disable),
    el('p', {class: 'hint'}, 'Model budget (spec.budget): FIELD=VALUE items, FIELD=none lifts a limit.'),
    el('div', {class: 'row'}, el('label', {for: budgetId}, 'Budget'), d.budget),
    d.contextSubmit, d.contextPermission, d.contextMessage, d.contextReport);
  form.addEventListener('submit', (e) => { e.preventDefault(); onContext(d); });

  d.auditRefresh = el('button', {type: 'button', 'data-testid': 'audit-refresh'}, 'Refresh audit');
  d.auditRefresh.addEventListener('click', () => loadAudit());
  d.auditMessage = el('p', {'data-testid': 'audit-message', role: 'status', class: 'message'});
  d.auditBody = el('tbody');
  const auditTable = el('table', {class: 'small'},
    el('caption', {class: 'visually-hidden'}, 'Audit records of the proxy, newest first'),
    el('thead', null, el('tr', null, ['Time', 'Decision', 'Risk', 'Server', 'Tool', 'Outcome', 'Duration',
      'Rule/error'].map((h) => el('th', {scope: 'col'}, h)))),
    d.auditBody);

  // The Logs tab: the end of a container's log of the task's pod (pods/log, as `task logs`).
  const containerId = `logs-container-${uid}`;
  d.logsContainer = el('select', {id: containerId, 'data-testid': 'logs-container'},
    el('option', {value: 'agent'}, 'agent'), el('option', {value: 'proxy'}, 'mcp-proxy (the task\'s proxy)'));
  d.logsContainer.addEventListener('change', () => loadLogs());
  d.logsRefresh = el('button', {type: 'button', 'data-testid': 'logs-refresh'}, 'Refresh log');
  d.logsRefresh.addEventListener('click', () => loadLogs());
  d.logsMessage = el('p', {'data-testid': 'logs-message', role: 'status', class: 'message'});
  d.logsText = el('pre', {'data-testid': 'logs-text', class: 'log', tabindex: 0, 'aria-label': 'Log'});
  d.logsSeq = 0;

  const headingId = `detail-heading-${uid}`;
  d.tabs = {};
  d.panels = {};
  const tabList = el('div', {role: 'tablist', class: 'tabs', 'aria-label': 'Task views'});
  for (const [name, label] of [['overview', 'Overview'], ['logs', 'Logs']]) {
    const tabId = `tab-${name}-${uid}`, panelId = `panel-${name}-${uid}`;
    d.tabs[name] = el('button', {type: 'button', role: 'tab', id: tabId, 'aria-controls': panelId,
      'data-testid': `tab-${name}`}, label);
    d.tabs[name].addEventListener('click', () => showTab(name, true));
    d.tabs[name].addEventListener('keydown', (e) => {
      if (e.key !== 'ArrowRight' && e.key !== 'ArrowLeft') return;
      e.preventDefault();
      const other = name === 'overview' ? 'logs' : 'overview';
      showTab(other, true);
      d.tabs[other].focus();
    });
    tabList.append(d.tabs[name]);
    d.panels[name] = el('div', {role: 'tabpanel', id: panelId, 'aria-labelledby': tabId, 'data-testid': `panel-${name}`});
  }
  d.panels.logs.append(
    el('div', {class: 'row'}, el('label', {for: containerId}, 'Container'), d.logsContainer, d.logsRefresh),
    d.logsMessage, d.logsText);
  d.panels.overview.append(
  el('dl', {class: 'fields summary'}, summary),
  el('div', {class: 'row'}, d.cancel, d.cancelMessage), d.cancelPermission,
  el('h3', null, 'Calls waiting for approval'), d.noApprovals, d.approvalList,
  d.resultBox, d.cancellationBox,
  el('h3', null, 'Tools'), el('p', null, 'Source: ', d.toolsSource), d.toolLines, d.servers,
  el('h3', null, 'Grant or take away tools'), form,
  el('h3', null, 'Context history'), d.history,
  el('h3', null, 'Conditions'), d.conditions,
  el('h3', null, 'Audit (the proxy\'s last 50 calls)'), el('div', {class: 'row'}, d.auditRefresh, d.auditMessage),
  el('div', {class: 'scroll'}, auditTable));
  d.section = el('section', {'data-testid': 'task-detail', 'data-namespace': t.namespace, 'data-name': t.name,
    class: 'detail', 'aria-labelledby': headingId},
  el('h2', {id: headingId}, `${t.namespace}/${t.name}`), tabList, d.panels.overview, d.panels.logs);
  return d;
}

// Shows one of the detail's tabs (the choice is kept for the next task selected).
function showTab(name, chosen) {
  const d = detail;
  if (!d) return;
  if (chosen) state.tab = name;
  for (const [n, tab] of Object.entries(d.tabs)) {
    const on = n === name;
    tab.setAttribute('aria-selected', String(on));
    tab.tabIndex = on ? 0 : -1;
    d.panels[n].hidden = !on;
  }
  clearTimeout(d.logsTimer);
  if (name === 'logs') loadLogs();
}

// The log, again every 5 s while its tab is shown.
async function loadLogs() {
  const d = detail;
  if (!d) return;
  clearTimeout(d.logsTimer);
  const seq = ++d.logsSeq;
  const may = allowedTo(d.ns, 'logs');
  if (may && may.allowed === false) {
    showResult(d.logsMessage, {ok: false, text: `You may not read this log: ${may.reason}`});
    d.logsText.replaceChildren();
    d.logsText.hidden = true;
    return;
  }
  d.logsRefresh.disabled = true;
  const res = await request(`${taskUrl(d.ns, d.name)}/logs?container=${d.logsContainer.value}&tailLines=500`);
  if (seq !== d.logsSeq || detail !== d) return;
  d.logsRefresh.disabled = false;
  if (!res.ok) {
    showResult(d.logsMessage, res);
    if (res.data && res.data.status === 403) loadAccess(d.ns, true);
    d.logsText.replaceChildren();
    d.logsText.hidden = true;
  } else {
    const data = res.data || {};
    showResult(d.logsMessage, {ok: true, text: orDash(data.message)});
    const text = String(data.text || '');
    d.logsText.hidden = !text;
    // Only on change: keeps a person's selection; stays at the end when it was there.
    if (d.logsShown !== text) {
      const atEnd = d.logsText.scrollTop + d.logsText.clientHeight >= d.logsText.scrollHeight - 4;
      d.logsShown = text;
      d.logsText.replaceChildren(visible(text));
      if (atEnd) d.logsText.scrollTop = d.logsText.scrollHeight;
    }
  }
  if (!d.panels.logs.hidden) d.logsTimer = setTimeout(loadLogs, 5000);
}

function fillDetail(t) {
  const d = detail;
  d.phase.textContent = orDash(t.phase);
  d.result.replaceChildren(visible(orDash(t.resultLine)));
  d.usage.replaceChildren(visible(orDash(t.usageLine)));
  // A spent budget stands out: the task waits for a person to raise it.
  d.usage.classList.toggle('alert', Boolean(t.budgetExceeded));
  d.context.textContent = `${orDash(t.servedContextVersion)}/${orDash(t.contextVersion)}`;
  if (d.created.dataset.at !== String(t.createdAt)) {
    d.created.dataset.at = String(t.createdAt);
    d.created.replaceChildren(timeEl(t.createdAt, 'detail-created'));
  }
  d.service.replaceChildren(visible(orDash(t.service)));
  d.taskId.textContent = orDash(t.taskId);
  d.prompt.replaceChildren(visible(orDash(t.prompt)));
  loadAccess(t.namespace, false);  // again once the answer is old
  const mayCancel = allowedTo(d.ns, 'cancel'), mayChange = allowedTo(d.ns, 'context');
  const noCancel = !!mayCancel && mayCancel.allowed === false, noChange = !!mayChange && mayChange.allowed === false;
  d.cancel.disabled = d.cancelBusy || TERMINAL.has(t.phase) || noCancel;
  if (d.cancel.disabled) disarm(d);
  d.cancelPermission.textContent = noCancel && !TERMINAL.has(t.phase) ? `Cancel is off: ${mayCancel.reason}` : '';
  d.contextSubmit.disabled = d.contextBusy || noChange;
  d.contextPermission.textContent = noChange ? `Changing tools and budget is off: ${mayChange.reason}` : '';

  // Pending first (oldest first: they expire first), then the decided ones, newest first.
  const approvals = (t.approvals || []).slice().sort((a, b) =>
    (isPending(b) - isPending(a)) ||
    (isPending(a) ? 1 : -1) * String(a.requestedAt).localeCompare(String(b.requestedAt)));
  const nodes = approvals.map((a) => approvalNode(d, a));
  const ids = new Set(approvals.map((a) => a.id));
  for (const id of d.approvals.keys()) if (!ids.has(id)) d.approvals.delete(id);
  syncChildren(d.approvalList, nodes);
  d.noApprovals.hidden = nodes.length > 0;

  d.resultBox.replaceChildren(...(t.result ? [el('h3', null, 'Result'), dl(t.result)] : []));
  d.cancellationBox.replaceChildren(...(t.cancellation ? [el('h3', null, 'Cancellation'), dl(t.cancellation)] : []));
  const tools = t.tools || {};
  d.toolsSource.textContent = orDash(tools.source);
  d.toolLines.replaceChildren(...(tools.lines || []).map((l) => el('li', {'data-testid': 'tool-line'}, visible(l))));
  d.servers.replaceChildren(table('Servers', ['Server', 'Enabled', 'Allow', 'Deny'],
    (t.servers || []).map((s) => el('tr', null, el('td', null, s.name), el('td', null, s.enabled === false ? 'no' : 'yes'),
      el('td', null, list(s.allow)), el('td', null, list(s.deny))))));
  d.history.replaceChildren(table('Context history, oldest first', ['Version', 'Time', 'By', 'Changes'],
    (t.history || []).map((h) => el('tr', {'data-testid': 'history-row'}, el('td', null, orDash(h.contextVersion)),
      el('td', null, timeEl(h.time)), el('td', null, visible(orDash(h.by))), el('td', null, visible(list(h.changes)))))));
  d.conditions.replaceChildren(table('Conditions', ['Type', 'Status', 'Reason', 'Message', 'Last transition'],
    (t.conditions || []).map((c) => el('tr', null, ['type', 'status', 'reason', 'message']
      .map((k) => el('td', null, visible(orDash(c[k])))), el('td', null, timeEl(c.lastTransitionTime))))));

  // The audit follows the task: reload (debounced) when its approvals or served context change.
  const sig = JSON.stringify([t.servedContextVersion, (t.approvals || []).map((a) => [a.id, a.state])]);
  if (d.auditSig !== undefined && sig !== d.auditSig) {
    clearTimeout(d.auditTimer);
    d.auditTimer = setTimeout(loadAudit, 1000);
  }
  d.auditSig = sig;
}

// ---- approvals ---------------------------------------------------------------------------------

function approvalNode(d, a) {
  let r = d.approvals.get(a.id);
  if (!r) {
    r = buildApproval(d, a.id);
    d.approvals.set(a.id, r);
  }
  const pending = isPending(a);
  r.a = a;
  r.article.dataset.state = String(a.state).toLowerCase();
  r.call.textContent = `${a.server}/${a.tool}`;
  r.meta.replaceChildren('Requested ', timeEl(a.requestedAt, 'approval-requested'),
    ` · context version ${orDash(a.contextVersion)} · state ${a.state}`);
  r.masked.textContent = (a.masked || []).length
    ? `Secrets masked in the params: ${a.masked.map((m) => `${m.secret}/${m.key} (${m.count}×)`).join(', ')}` : '';
  // Only on change: keeps a person's text selection, and the whole params open or shut as they left them.
  if (r.paramsText !== a.params || r.withheld !== a.withheld || r.argumentsText !== a.arguments) {
    const first = r.paramsText === undefined;
    r.paramsText = a.params;
    r.withheld = a.withheld;
    r.argumentsText = a.arguments;
    const hasArguments = typeof a.arguments === 'string' && !a.withheld;
    r.argsBox.hidden = !hasArguments;
    r.args.replaceChildren(hasArguments ? visible(a.arguments) : '');
    const kept = a.params !== null && a.params !== undefined;
    r.params.replaceChildren(a.withheld
      ? el('span', {class: 'muted'}, `(not shown: the params with the task's Secret values masked ${WITHHELD[a.withheld] || 'cannot be shown'}; nobody can see what this call sends, so it can only be rejected)`)
      : kept ? visible(a.params) : '');
    r.raw.hidden = !kept && !a.withheld;
    r.notKept.textContent = !kept && !a.withheld ? 'The params are not kept once the call is decided (the digest names the call).' : '';
    // Without arguments to show first, the whole params are what there is: open.
    if (first || !hasArguments) r.raw.open = !hasArguments;
  }
  r.rawSummary.textContent = a.params === null || a.params === undefined || a.withheld
    ? 'Whole params' : `Whole params: ${orDash(a.paramsBytes)} bytes, exactly as the proxy forwards them (what the digest is checked over)`;
  r.digest.textContent = orDash(a.digest);
  r.check.textContent = pending ? (CHECKS[a.digestCheck] || '') : '';
  r.check.dataset.check = a.digestCheck || '';
  // What cannot be seen, or is not what its digest names, cannot be approved (the CLI refuses too).
  const approvable = !a.withheld && (a.digestCheck === 'covers' || a.digestCheck === 'salted');
  if (pending) r.countdown.dataset.expires = a.expiresAt;
  else delete r.countdown.dataset.expires;
  r.countdown.textContent = pending ? countdown(a.expiresAt) : String(a.state).toLowerCase() === 'expired' ? 'expired' : '';
  r.decided.replaceChildren(...(pending ? [] : [visible(`${a.state}${a.decidedBy ? ` by ${a.decidedBy}` : ''}`),
    ...(a.decidedAt ? [' ', timeEl(a.decidedAt)] : []), ...(a.reason ? [': ', visible(a.reason)] : [])]));
  r.controls.hidden = !pending;
  // What the API server said the caller may do (advice: it still decides the request).
  const may = allowedTo(d.ns, 'approve');
  const refused = may && may.allowed === false;
  r.permission.textContent = pending && refused ? `Approve and Reject are off: ${may.reason}` : '';
  r.reject.disabled = !pending || r.busy || refused;
  r.approve.disabled = !pending || r.busy || !approvable || refused;
  return r.article;
}

// What the digest says of the params shown (`digestCheck`, recomputed by the console).
const CHECKS = {
  covers: 'recomputed from the whole params: it names exactly them',
  salted: 'salted by the proxy (Secret values are masked): only the proxy can check it, and it does',
  mismatch: 'DOES NOT NAME THE PARAMS SHOWN: this request shows another call than an approval would let through; it cannot be approved',
  unreadable: 'the params shown are not a JSON object: this request cannot be checked; it cannot be approved',
};
const WITHHELD = {
  tooLarge: 'would take more than a request may hold',
  ambiguous: 'would have two keys that read the same',
  failed: 'could not be made',
};

function buildApproval(d, id) {
  const reasonId = `reason-${++uid}`, permissionId = `permission-${uid}`;
  const r = {busy: false};
  r.call = el('h4', {'data-testid': 'approval-call', class: 'call'});
  r.meta = el('p', {class: 'muted'});
  r.masked = el('p', {class: 'muted'});
  r.notKept = el('p', {class: 'muted'});
  r.args = el('pre', {'data-testid': 'approval-arguments', class: 'params', tabindex: 0, 'aria-label': 'Arguments'});
  r.argsBox = el('div', {class: 'arguments'}, el('h5', null, 'Arguments'), r.args);
  r.params = el('pre', {'data-testid': 'approval-params', class: 'params', tabindex: 0, 'aria-label': 'Whole params'});
  r.rawSummary = el('span');
  r.raw = el('details', {'data-testid': 'approval-raw', class: 'raw'},
    el('summary', {'data-testid': 'approval-raw-toggle'}, r.rawSummary), r.params);
  r.digest = el('code', {'data-testid': 'approval-digest'});
  r.check = el('span', {'data-testid': 'approval-digest-check', class: 'muted'});
  r.countdown = el('p', {'data-testid': 'approval-countdown', class: 'countdown'});
  r.decided = el('p', {class: 'decided'});
  r.reason = el('input', {id: reasonId, 'data-testid': 'approval-reason', autocomplete: 'off'});
  r.approve = el('button', {type: 'button', 'data-testid': 'approve', class: 'approve', 'aria-describedby': permissionId}, 'Approve');
  r.reject = el('button', {type: 'button', 'data-testid': 'reject', class: 'danger', 'aria-describedby': permissionId}, 'Reject');
  r.permission = el('p', {id: permissionId, 'data-testid': 'approval-permission', class: 'permission'});
  r.message = el('p', {'data-testid': 'approval-message', role: 'alert', class: 'message'});
  r.approve.addEventListener('click', () => decide(d, r, 'approve'));
  r.reject.addEventListener('click', () => decide(d, r, 'reject'));
  r.controls = el('div', {class: 'controls'},
    el('label', {for: reasonId}, 'Reason (optional)'), r.reason, r.approve, r.reject);
  r.article = el('article', {'data-testid': 'approval', 'data-id': id, class: 'approval'},
    r.call, r.countdown, r.argsBox, r.raw, r.notKept, el('p', null, 'Digest: ', r.digest, ' ', r.check), r.meta, r.masked,
    r.decided, r.controls, r.permission, r.message);
  return r;
}

async function decide(d, r, decision) {
  r.busy = true;
  r.approve.disabled = r.reject.disabled = true;
  const reason = r.reason.value.trim();
  const res = await request(`${taskUrl(d.ns, d.name)}/approvals/${encodeURIComponent(r.a.id)}`,
    {decision, reason: reason || null, digest: r.a.digest});
  r.busy = false;
  showResult(r.message, res);
  if (res.data && res.data.status === 403) loadAccess(d.ns, true);
  approvalNode(d, r.a);
}

// ---- what the caller may do ------------------------------------------------------------------------

// The API server's answer for `action` in `ns` ({allowed, reason}), or null while unknown.
function allowedTo(ns, action) {
  const known = state.access.get(ns);
  return (known && known.data && known.data[action]) || null;
}

// Asks /access for `ns` (again when `force`, or when the answer is old), then renders.
async function loadAccess(ns, force) {
  const known = state.access.get(ns);
  if (known && (known.loading || (!force && Date.now() - known.at < ACCESS_TTL_MS))) return;
  state.access.set(ns, {data: known && known.data, at: known ? known.at : 0, loading: true});
  const res = await request(`/api/namespaces/${encodeURIComponent(ns)}/access`);
  // Unknown (the console could not ask): nothing is disabled; the API server decides each request.
  state.access.set(ns, {data: res.ok ? res.data : null, at: Date.now(), loading: false});
  render();
}

// ---- cancel, context, audit ------------------------------------------------------------------------

// Two presses: the first arms the button (it becomes `cancel-confirm`), the second cancels.
function onCancel(d) {
  if (d.cancel.dataset.testid !== 'cancel-confirm') {
    d.cancel.dataset.testid = 'cancel-confirm';
    d.cancel.textContent = 'Press again to cancel the task';
    d.disarmTimer = setTimeout(() => disarm(d), 10000);
    return;
  }
  disarm(d);
  d.cancelBusy = true;
  d.cancel.disabled = true;
  request(`${taskUrl(d.ns, d.name)}/cancel`, {}).then((res) => {
    d.cancelBusy = false;
    showResult(d.cancelMessage, res);
    const t = state.tasks.get(d.key);
    d.cancel.disabled = !!t && TERMINAL.has(t.phase);
  });
}

function disarm(d) {
  clearTimeout(d.disarmTimer);
  d.cancel.dataset.testid = 'cancel';
  d.cancel.textContent = 'Cancel task';
}

function summary(tools) {
  if (!tools || tools.kind === 'off') return 'off';
  if (tools.kind === 'tools') {
    const names = tools.tools || [];
    return `${names.length} tool${names.length === 1 ? '' : 's'}${names.length ? ` (${names.join(', ')})` : ''}`;
  }
  if (tools.kind === 'patterns') {
    const allow = tools.allow && tools.allow.length ? `allow ${tools.allow.join(', ')}` : 'allow all';
    return tools.deny && tools.deny.length ? `${allow}; deny ${tools.deny.join(', ')}` : allow;
  }
  return JSON.stringify(tools);
}

async function onContext(d) {
  const split = (s) => s.split(/[\s,]+/).filter(Boolean);
  const enable = split(d.enable.value), disable = split(d.disable.value), budget = split(d.budget.value);
  d.contextReport.replaceChildren();
  if (!enable.length && !disable.length && !budget.length) {
    showResult(d.contextMessage, {ok: false,
      text: 'Give at least one server:tool to enable or disable, or a budget change (FIELD=VALUE).'});
    return;
  }
  d.contextSubmit.disabled = d.contextBusy = true;
  const res = await request(`${taskUrl(d.ns, d.name)}/context`, {enable, disable, budget});
  d.contextSubmit.disabled = d.contextBusy = false;
  if (res.data && res.data.status === 403) loadAccess(d.ns, true);
  showResult(d.contextMessage, res);
  if (!res.ok || !res.data) return;
  d.enable.value = d.disable.value = d.budget.value = '';
  const lines = [...(res.data.notes || [])];
  if (res.data.budget) lines.push(`budget: ${res.data.budget}`);
  for (const s of (res.data.report && res.data.report.servers) || []) {
    const delta = [...(s.added || []).map((n) => `+${n}`), ...(s.removed || []).map((n) => `-${n}`)];
    lines.push(`${s.server}: ${summary(s.before)} → ${summary(s.after)}${delta.length ? ` [${delta.join(' ')}]` : ''}`);
  }
  d.contextReport.replaceChildren(...lines.map((l) => el('li', null, visible(l))));
}

async function loadAudit() {
  const d = detail;
  if (!d) return;
  clearTimeout(d.auditTimer);
  const seq = ++d.auditSeq;  // an older answer arriving late must not overwrite a newer one
  d.auditRefresh.disabled = true;
  d.auditMessage.textContent = 'Loading…';
  delete d.auditMessage.dataset.ok;
  const res = await request(`${taskUrl(d.ns, d.name)}/audit?limit=50`);
  if (seq !== d.auditSeq) return;
  d.auditRefresh.disabled = false;
  if (!res.ok) {
    showResult(d.auditMessage, res);
    d.auditBody.replaceChildren();
    return;
  }
  const data = res.data || {};
  const records = (data.records || []).slice().reverse();  // the proxy sends oldest first
  d.auditBody.replaceChildren(...records.map(auditRow));
  let text = records.length ? `${records.length} of ${orDash(data.matched)} records, from pod ${orDash(data.pod)}`
    : `No calls recorded yet (pod ${orDash(data.pod)}).`;
  if (data.dropped) text += `; ${data.dropped} older records were dropped by the proxy`;
  showResult(d.auditMessage, {ok: true, text});
}

function auditRow(r) {
  const s = (k) => (typeof r[k] === 'string' ? r[k] : '');
  // A refusal's error repeats its rule, which says it shorter (as `task audit` prints it).
  const detailText = s('outcome') === 'denied' && s('rule') ? s('rule') : s('error') || s('rule');
  const ms = typeof r.durationMs === 'number' ? `${r.durationMs.toFixed(1)}ms` : '';
  return el('tr', {'data-testid': 'audit-row', 'data-server': s('server'), 'data-tool': s('tool'),
    'data-decision': s('decision'), 'data-outcome': s('outcome')},
  el('td', null, s('ts') ? timeEl(s('ts')) : ''),
  [s('decision'), s('risk'), s('server'), s('tool'), s('outcome'), ms, detailText]
    .map((v) => el('td', null, visible(v))));
}

// ---- start -----------------------------------------------------------------------------------------

async function start() {
  setupNotifications();
  $('task-filter').addEventListener('input', (e) => { state.filter = e.target.value; renderList(); });
  state.selected = readHash();
  window.addEventListener('hashchange', () => { state.selected = readHash(); render(); });
  setInterval(() => {
    for (const node of document.querySelectorAll('[data-testid="approval-countdown"][data-expires]')) {
      node.textContent = countdown(node.dataset.expires);
    }
    for (const node of document.querySelectorAll('time.rel[data-at]')) {
      const text = ago(node.dataset.at);
      if (node.textContent !== text) node.textContent = text;
    }
  }, 1000);
  render();
  connect();
  const [session, catalog] = await Promise.all([request('/api/session'), request('/api/catalog')]);
  if (session.ok) {
    state.session = session.data;
    $('whoami').textContent = session.data.user || '(unknown)';
    $('scope').textContent = session.data.allNamespaces ? 'All namespaces'
      : `Namespace: ${orDash(session.data.namespace)}`;
    render();
  } else {
    $('whoami').textContent = '(unknown)';
    $('problem').textContent = session.text;
    $('problem').hidden = false;
  }
  if (catalog.ok && catalog.data) {
    $('tool-options').replaceChildren(...(catalog.data.servers || []).flatMap((s) =>
      (s.tools || []).map((tool) => el('option', {value: `${s.name}:${tool}`}))));
  }
}

start();
