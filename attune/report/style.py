"""The stylesheet shared by the HTML report and the leaderboard (inlined into every page; no web fonts)."""

BASE_CSS = """
:root { --fg:#1d2430; --muted:#5f6b7a; --line:#d9dee5; --bg:#f6f7f9; --card:#fff; --accent:#1f5fbf;
        --ok:#23863a; --bad:#c62828; --warn:#a86b00; --sim:#6a4fb3; --real:#0b7a75; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
       color:var(--fg); background:var(--bg); }
header.page { background:#17202e; color:#f3f5f8; padding:18px 28px 14px; }
header.page h1 { margin:0 0 4px; font-size:21px; font-weight:600; }
header.page .sub { color:#b9c3d0; font-size:13px; }
header.page a { color:#cfe0ff; }
main { max-width:1440px; margin:0 auto; padding:18px 28px 40px; }
section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:16px 18px;
          margin:0 0 18px; }
section h2 { margin:0 0 10px; font-size:16px; }
section h3 { margin:14px 0 6px; font-size:14px; }
p { margin:6px 0; }
.muted { color:var(--muted); }
.warn { border-left:4px solid #d62728; padding:.4em .8em; background:#fdecea; }
.kpis { display:grid; grid-template-columns:repeat(auto-fit,minmax(150px,1fr)); gap:10px; margin:0; }
.kpi { border:1px solid var(--line); border-radius:6px; padding:8px 10px; background:#fbfcfd; }
.kpi .v { font-size:19px; font-weight:600; }
.kpi .k { color:var(--muted); font-size:12px; }
table { border-collapse:collapse; width:100%; font-size:12.5px; }
th, td { border-bottom:1px solid var(--line); padding:5px 6px; text-align:left; vertical-align:top; }
th { background:#f0f2f5; font-weight:600; position:sticky; top:0; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
#trials td.rationale { max-width:280px; }
#trials td code { overflow-wrap:anywhere; }
#trials td:nth-child(3) { max-width:220px; }
#trials td.gate { max-width:240px; font-size:12px; }
#trials .decision { color:var(--muted); font-size:12px; margin-top:2px; }
tr.highlight td { background:#fff7d6; }
.badge { display:inline-block; padding:1px 7px; border-radius:10px; font-size:11.5px; font-weight:600;
         color:#fff; white-space:nowrap; }
.badge.sim { background:var(--sim); } .badge.real { background:var(--real); }
.badge.pass { background:var(--ok); } .badge.fail { background:var(--bad); } .badge.na { background:#8a94a3; }
code, pre { font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace; font-size:12px; }
pre { background:#f4f6f8; border:1px solid var(--line); border-radius:6px; padding:10px; overflow:auto;
      max-height:420px; margin:6px 0; }
pre.diff .add { background:#e6ffec; color:#0f5323; display:block; }
pre.diff .del { background:#ffebe9; color:#82071e; display:block; }
pre.diff .hunk { color:#6e7781; display:block; }
.chart { display:block; max-width:100%; height:auto; }
.chart .tick { font-size:11px; fill:#555; }
.chart .axis-label { font-size:12px; fill:#333; }
.chart .pt-label { font-size:9px; fill:#444; }
.chart .trial { cursor:pointer; }
ul.legend { list-style:none; display:flex; flex-wrap:wrap; gap:6px 16px; padding:0; margin:8px 0 0;
            font-size:12px; }
ul.legend li { display:flex; align-items:center; gap:5px; }
.filters { display:flex; flex-wrap:wrap; gap:10px 18px; align-items:center; margin:0 0 10px; font-size:13px; }
.filters label { display:flex; gap:5px; align-items:center; }
.filters select { font:inherit; padding:2px 4px; }
details summary { cursor:pointer; color:var(--accent); }
footer { color:var(--muted); font-size:12px; text-align:center; padding:8px 0 24px; }
a { color:var(--accent); }
"""
