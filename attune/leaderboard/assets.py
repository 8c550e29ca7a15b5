"""The leaderboard's own stylesheet additions and its filter script (written to ``SITE/assets/``; no CDN)."""

SITE_CSS_EXTRA = """
table.board td.rank { font-weight:700; text-align:right; width:2.5em; }
table.board tbody.group tr.group-head th { background:#e9eef6; font-size:13px; }
table.board tr.entry td { white-space:nowrap; }
table.board tr.entry td.title { white-space:normal; }
#count { color:var(--muted); }
.kind-note { font-size:12px; color:var(--muted); }
nav.crumbs { font-size:13px; margin-bottom:4px; }
"""

SITE_JS = """
(function () {
  'use strict';
  function byId(id) { return document.getElementById(id); }
  var rows = Array.prototype.slice.call(document.querySelectorAll('tr.entry'));
  var groups = Array.prototype.slice.call(document.querySelectorAll('tbody.group'));
  var controls = {framework: byId('f-framework'), hardware: byId('f-hardware'), size: byId('f-size'),
                  real: byId('f-measured'), sim: byId('f-simulated'), q: byId('f-search')};
  if (!controls.framework) { document.documentElement.setAttribute('data-ready', '1'); return; }
  function matches(r) {
    var d = r.dataset;
    if (controls.framework.value && d.framework !== controls.framework.value) { return false; }
    if (controls.hardware.value && d.hardware !== controls.hardware.value) { return false; }
    if (controls.size.value && d.size !== controls.size.value) { return false; }
    if (d.kind === 'measured' && !controls.real.checked) { return false; }
    if (d.kind === 'simulated' && !controls.sim.checked) { return false; }
    var q = controls.q.value.trim().toLowerCase();
    if (q && d.search.indexOf(q) < 0) { return false; }
    return true;
  }
  function apply() {
    var shown = 0;
    rows.forEach(function (r) { var ok = matches(r); r.hidden = !ok; if (ok) { shown += 1; } });
    groups.forEach(function (g) { g.hidden = !g.querySelector('tr.entry:not([hidden])'); });
    byId('count').textContent = shown + ' of ' + rows.length + ' recipes';
    var params = [];
    Object.keys(controls).forEach(function (k) {
      var el = controls[k];
      var v = el.type === 'checkbox' ? (el.checked ? '' : '0') : el.value;
      if (v) { params.push(k + '=' + encodeURIComponent(v)); }
    });
    try {  // keep the filters in the address, so a filtered view can be linked
      window.history.replaceState(null, '', params.length ? '#' + params.join('&') : location.pathname);
    } catch (e) { /* some browsers refuse history changes on file:// pages; the filters still work */ }
  }
  (location.hash || '').replace(/^#/, '').split('&').forEach(function (kv) {
    var p = kv.split('='), el = controls[p[0]];
    if (!el) { return; }
    if (el.type === 'checkbox') { el.checked = p[1] !== '0'; } else { el.value = decodeURIComponent(p[1] || ''); }
  });
  Object.keys(controls).forEach(function (k) {
    controls[k].addEventListener('change', apply);
    controls[k].addEventListener('input', apply);
  });
  apply();
  document.documentElement.setAttribute('data-ready', '1');
})();
"""
