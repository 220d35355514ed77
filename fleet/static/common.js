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
// An epoch time as the pages print it: UTC, to the second ("2026-12-05 08:40:12Z"), the one format of every
// page and of fleet/text.py stamp (the timeline SVG's titles).
function stamp(sec){return sec?new Date(sec*1000).toISOString().replace("T"," ").replace(/\.\d+Z$/,"Z"):"?";}
// An RFC 3339 time from the wire in the same format; as it came when it does not parse (shown, never guessed).
function stampIso(iso){const ms=Date.parse(iso); return isNaN(ms)?String(iso??"?"):stamp(ms/1000);}
// How long ago an epoch time was: "12 s ago", "5 min ago", "1 h 5 min ago", "3 d ago".
function ago(sec){
  const s=Math.max(0,Math.round(Date.now()/1000-sec));
  if(s<60) return `${s} s ago`;
  if(s<3600) return `${Math.floor(s/60)} min ago`;
  if(s<86400) return `${Math.floor(s/3600)} h ${Math.floor(s%3600/60)} min ago`;
  return `${Math.floor(s/86400)} d ago`;
}
