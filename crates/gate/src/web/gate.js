// The review page's script: passkey pairing and sign-in, decisions signed with the
// passkey, and live updates of the open work. Served by the gate itself; no inline script.
'use strict';

const b64u = {
  enc(buffer) {
    let s = '';
    for (const b of new Uint8Array(buffer)) s += String.fromCharCode(b);
    return btoa(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  },
  dec(text) {
    let s = text.replace(/-/g, '+').replace(/_/g, '/');
    while (s.length % 4) s += '=';
    const raw = atob(s);
    const out = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out.buffer;
  },
};

function csrf() {
  const meta = document.querySelector('meta[name=gate-csrf]');
  return meta ? meta.content : '';
}

function say(text, state) {
  const where = document.getElementById('said');
  if (where) where.textContent = text;
  document.body.dataset.state = state;
}

async function post(url, body) {
  const response = await fetch(url, {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'content-type': 'application/json', 'x-gate-csrf': csrf() },
    body: JSON.stringify(body || {}),
  });
  let answer;
  try {
    answer = await response.json();
  } catch (_) {
    answer = { ok: false, text: 'the gate answered ' + response.status };
  }
  return answer;
}

function creationOptions(options) {
  const p = options.publicKey;
  p.challenge = b64u.dec(p.challenge);
  p.user.id = b64u.dec(p.user.id);
  (p.excludeCredentials || []).forEach((c) => { c.id = b64u.dec(c.id); });
  return { publicKey: p };
}

function requestOptions(options) {
  const p = options.publicKey;
  p.challenge = b64u.dec(p.challenge);
  (p.allowCredentials || []).forEach((c) => { c.id = b64u.dec(c.id); });
  return { publicKey: p };
}

function registration(c) {
  return {
    id: c.id, rawId: b64u.enc(c.rawId), type: c.type, extensions: {},
    response: {
      attestationObject: b64u.enc(c.response.attestationObject),
      clientDataJSON: b64u.enc(c.response.clientDataJSON),
    },
  };
}

function assertion(c) {
  return {
    id: c.id, rawId: b64u.enc(c.rawId), type: c.type, extensions: {},
    response: {
      authenticatorData: b64u.enc(c.response.authenticatorData),
      clientDataJSON: b64u.enc(c.response.clientDataJSON),
      signature: b64u.enc(c.response.signature),
      userHandle: c.response.userHandle ? b64u.enc(c.response.userHandle) : null,
    },
  };
}

async function pair() {
  const token = location.pathname.split('/').pop();
  say('Starting…', 'busy');
  const started = await post('/api/pair/start', { token });
  if (!started.ok) return say(started.text, 'failed');
  let credential;
  try {
    credential = await navigator.credentials.create(creationOptions(started.options));
  } catch (e) {
    return say('No passkey was created (' + e.message + '); run gate pair again.', 'failed');
  }
  const done = await post('/api/pair/finish', { token, credential: registration(credential) });
  if (!done.ok) return say(done.text, 'failed');
  say(done.text, 'done');
  location.assign('/');
}

async function login() {
  say('Signing in…', 'busy');
  const started = await post('/api/login/start');
  if (!started.ok) return say(started.text, 'failed');
  let credential;
  try {
    credential = await navigator.credentials.get(requestOptions(started.options));
  } catch (e) {
    return say('Not signed in (' + e.message + ').', 'failed');
  }
  const done = await post('/api/login/finish', { id: started.id, credential: assertion(credential) });
  if (!done.ok) return say(done.text, 'failed');
  location.reload();
}

function describe(statement) {
  const ids = statement.ids.map((id) => '#' + id).join(', ');
  switch (statement.decision) {
    case 'approve': return 'approve ' + ids;
    case 'approve-all-of-kind': return 'approve ' + ids + ' and enable a rule for its kind';
    case 'reject': return 'reject ' + ids + (statement.reason ? ' (' + statement.reason + ')' : '');
    default: return 'revoke rule ' + statement.reason;
  }
}

// The digest of each call as this page shows it: a decision signs those, and the gate
// refuses it if a call changed since.
function digests(ids) {
  return ids.map((id) => {
    const shown = document.querySelector('[data-id="' + id + '"][data-digest]');
    return shown ? shown.dataset.digest : '';
  });
}

async function decide(decision, ids, reason, fullSeen) {
  say('Asking the gate…', 'busy');
  const started = await post('/api/decide/start', {
    decision, ids, digests: digests(ids), reason, full_seen: fullSeen,
  });
  if (!started.ok) { await refresh(); return say(started.text, 'failed'); }
  say('Sign with your passkey to ' + describe(started.statement) + '.', 'signing');
  let credential;
  try {
    credential = await navigator.credentials.get(requestOptions(started.options));
  } catch (e) {
    return say('Nothing was decided: not signed (' + e.message + ').', 'failed');
  }
  const done = await post('/api/decide/finish', { nonce: started.nonce, credential: assertion(credential) });
  await refresh();
  say(done.text, done.ok ? 'done' : 'failed');
}

function picked() {
  return Array.from(document.querySelectorAll('input.pick:checked')).map((i) => Number(i.value));
}

async function refresh() {
  if (location.pathname !== '/') return;
  const main = document.getElementById('main');
  if (!main) return;
  const response = await fetch('/rows', { credentials: 'same-origin' });
  if (response.status === 401) return say('You are signed out; reload the page to sign in.', 'failed');
  const keep = new Set(picked());
  const reasons = {};
  document.querySelectorAll('input.reason').forEach((i) => { reasons[i.dataset.id] = i.value; });
  main.innerHTML = await response.text();
  document.querySelectorAll('input.pick').forEach((i) => { i.checked = keep.has(Number(i.value)); });
  document.querySelectorAll('input.reason').forEach((i) => { i.value = reasons[i.dataset.id] || ''; });
  document.body.dataset.rows = String(document.querySelectorAll('article.action').length);
}

document.addEventListener('click', (event) => {
  const target = event.target.closest('button');
  if (!target) return;
  if (target.id === 'pair') return void pair();
  if (target.id === 'login') return void login();
  if (target.id === 'logout') {
    return void post('/api/logout').then(() => location.assign('/'));
  }
  if (target.id === 'approve-picked') return void decide('approve', picked(), null, false);
  if (target.id === 'reject-picked') return void decide('reject', picked(), null, false);
  if (target.id === 'revoke') {
    const rule = document.getElementById('rule').value;
    return void decide('revoke-rule', [], rule, false);
  }
  const decision = target.dataset.decide;
  if (decision) {
    const id = Number(target.dataset.id);
    const box = document.querySelector('input.reason[data-id="' + id + '"]');
    const reason = decision === 'reject' && box ? box.value : null;
    const fullSeen = Boolean(target.closest('[data-full-seen]'));
    decide(decision, [id], reason, fullSeen);
  }
});

document.addEventListener('DOMContentLoaded', () => {
  document.body.dataset.state = 'ready';
  document.body.dataset.rows = String(document.querySelectorAll('article.action').length);
  if (location.pathname === '/' && document.getElementById('main') && window.EventSource) {
    const events = new EventSource('/events');
    events.addEventListener('changed', () => { refresh(); });
    // The stream reports changes after it opened: what changed between this page's
    // rendering and then (or while a dropped stream reconnected) is read on each open.
    events.addEventListener('open', () => { refresh(); });
  }
});
