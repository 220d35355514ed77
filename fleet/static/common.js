// Shared by the dashboard's pages: fleet/dashboard.py _page puts this file where a page says
// "// @include common.js", inside its own inline <script> (the Content-Security-Policy admits only
// the page's inline blocks, by hash).

// The order fleet/state.py incident_rank gives: open first; one a cordon may act on, then one naming a
// culprit, the most confident first; then the most recently updated.
function incidentRank(a,b){
  return (a.status!=="open")-(b.status!=="open")||(!a.actionable)-(!b.actionable)||(!a.culprit)-(!b.culprit)||
    (Number(b.confidence)||0)-(Number(a.confidence)||0)||(Number(b.updated)||0)-(Number(a.updated)||0)||
    String(a.job).localeCompare(String(b.job));
}
// An epoch time as the pages print it: UTC, to the second ("2026-12-05 08:40:12Z").
function stamp(sec){return sec?new Date(sec*1000).toISOString().replace("T"," ").replace(/\.\d+Z$/,"Z"):"?";}
