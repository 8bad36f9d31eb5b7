// The job page's output card: while the job is active, ask for what the training process wrote after the
// last byte shown, every 2 s, and append it as text (never as HTML). The card keeps at most MAX characters;
// "Follow" keeps the newest line in view. A finished job is polled once more, then no longer.
(function () {
  const MAX = 256 * 1024;
  const pre = document.getElementById('output-text');
  if (!pre) return;
  const follow = document.getElementById('output-follow');
  const missing = document.getElementById('output-missing');
  let next = Number(pre.dataset.next || 0);
  let live = pre.dataset.live === '1';

  function toBottom() { if (follow && follow.checked) pre.scrollTop = pre.scrollHeight; }

  async function poll() {
    try {
      const response = await fetch(`${pre.dataset.url}?after=${next}`, { headers: { Accept: 'application/json' } });
      if (!response.ok) return;
      const chunk = await response.json();
      if (chunk.start < next && chunk.start === 0) pre.textContent = '';  // a new run rewrote the file
      if (chunk.text) {
        pre.append(document.createTextNode(chunk.text));
        if (pre.textContent.length > MAX) pre.textContent = pre.textContent.slice(-MAX);
        toBottom();
      }
      if (missing) { missing.textContent = chunk.detail || ''; missing.hidden = !chunk.detail; }
      next = chunk.end || next;
      const more = chunk.end < chunk.size;  // more than one chunk behind: ask again at once
      if (chunk.live || more) { live = chunk.live; setTimeout(poll, more ? 0 : 2000); }
    } catch (error) {
      setTimeout(poll, 5000);  // the server restarted or the network blinked: try again later
    }
  }

  if (follow) follow.addEventListener('change', toBottom);
  toBottom();
  if (live) setTimeout(poll, 2000);
})();
