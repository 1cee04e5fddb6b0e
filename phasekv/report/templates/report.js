(function(){
  const GREY_LINE = '#c8c8c8', GREY_FILL = 'rgba(190,190,190,0.12)';
  function plotAll(){
    document.querySelectorAll('script.pkv-spec').forEach(function(s){
      const spec = JSON.parse(s.textContent), div = document.getElementById(s.dataset.target);
      Plotly.newPlot(div, spec.data, spec.layout, {responsive: true, displaylogo: false});
    });
  }
  function select(model){
    document.querySelectorAll('#model-selector button').forEach(function(b){
      b.classList.toggle('active', b.dataset.model === model); });
    document.querySelectorAll('tr[data-model]').forEach(function(r){
      r.classList.toggle('dim', model !== 'all' && r.dataset.model !== model);
      r.classList.toggle('sel', model !== 'all' && r.dataset.model === model); });
    document.querySelectorAll('.pkv-plot').forEach(function(div){
      if (!div.data) return;
      const idx = [], line = [], marker = [], fill = [], opacity = [];
      div.data.forEach(function(t, i){
        const m = t.meta; if (!m || !m.model) return;
        const on = model === 'all' || m.model === model;
        idx.push(i); line.push(on ? m.color : GREY_LINE); marker.push(on ? m.color : GREY_LINE);
        fill.push(on ? m.fill : GREY_FILL); opacity.push(on ? 1 : 0.55);
      });
      if (idx.length) Plotly.restyle(div, {'line.color': line, 'marker.color': marker, 'fillcolor': fill,
                                           'opacity': opacity}, idx);
      const b = div.layout.meta && div.layout.meta.boundaries;
      if (b) Plotly.relayout(div, {shapes: (model in b) ? b[model] : []});
    });
    document.body.dataset.selected = model;
  }
  window.pkvSelect = select;
  document.addEventListener('DOMContentLoaded', function(){
    plotAll();
    document.querySelectorAll('#model-selector button').forEach(function(b){
      b.addEventListener('click', function(){ select(b.dataset.model); }); });
    document.querySelectorAll('tr[data-model]').forEach(function(r){
      r.addEventListener('click', function(){ select(r.dataset.model); });
      r.addEventListener('keydown', function(e){ if (e.key === 'Enter') select(r.dataset.model); }); });
    select('all');
  });
})();
