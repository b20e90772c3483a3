#!/usr/bin/env python3
"""What schedules cost a real `homing run` (BENCHMARKS.md, "Schedules"): (1) the host's memory
and its connections' messages to the NATS server per idle minute with N (default 10,000)
schedules created through the API, (2) the lag from a slot's fire time to its dispatch's start,
over 20 schedules firing every second for a minute.

    python3 scripts/schedule_costs.py target/release/homing nats|embedded
    CRON="0 0 1 1 *" N=10000 python3 scripts/schedule_costs.py ...   # schedules that stay idle

Needs the echo guest (`cargo xtask guests`) and, for NATS, `nats-server` in .tools (as
`cargo xtask test` installs it)."""
import json, os, socket, subprocess, sys, tempfile, time, urllib.parse, urllib.request

BIN, BACKEND = sys.argv[1], sys.argv[2]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATS = f'{ROOT}/.tools/python/bin/nats-server'
TOKEN = 'operator-secret-0123456789abcdef'

def free_port():
    s = socket.socket(); s.bind(('127.0.0.1', 0)); p = s.getsockname()[1]; s.close(); return p

def call(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={'Authorization': f'Bearer {TOKEN}', 'Content-Type': 'application/json'})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b'null')
    except urllib.error.HTTPError as e:
        return e.code, e.read()

def rss(pid):
    for line in open(f'/proc/{pid}/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) // 1024
    return 0

d = tempfile.mkdtemp()
port, nport, mport = free_port(), free_port(), free_port()
nats = None
store = ''
if BACKEND == 'nats':
    nats = subprocess.Popen([NATS, '-a', '127.0.0.1', '-p', str(nport), '-js', '-sd', f'{d}/js', '-m', str(mport)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    store = f'[store]\nbackend = "nats"\nurl = "nats://127.0.0.1:{nport}"\nprefix = "sb"\n'
open(f'{d}/op.token', 'w').write(TOKEN + '\n')
open(f'{d}/homing.toml', 'w').write(f'''
[host]
sweep_interval = "1s"
{store}
[api]
listen = "127.0.0.1:{port}"
max_concurrent = 4096
tokens = [{{ name = "op", role = "operator", secret = {{ file = "op.token" }} }}]
[plugins.echo]
path = "{ROOT}/examples/wasm/echo.wasm"
concurrency = 8
''')
host = subprocess.Popen([BIN, '--config', f'{d}/homing.toml', 'run'], stdout=subprocess.DEVNULL, stderr=open(f'{d}/host.log', 'w'), env={**os.environ, 'HOMING_LOG': 'warn'})
base = f'http://127.0.0.1:{port}'
for _ in range(600):
    try:
        if urllib.request.urlopen(base + '/readyz', timeout=1).status == 200: break
    except Exception: time.sleep(0.1)
time.sleep(2)
def conn_in_msgs():
    if not nats: return 0
    c = json.loads(urllib.request.urlopen(f'http://127.0.0.1:{mport}/connz', timeout=5).read())
    return sum(x.get('in_msgs', 0) for x in c.get('connections', []))
out = {'backend': BACKEND}
out['rss_mib_no_schedules'] = rss(host.pid)
t = time.time()
N = int(os.environ.get('N', '10000'))
for i in range(N):
    s, r = call('POST', base + '/v1/schedules', {'name': f'idle-{i:05d}', 'agent': 'echo', 'cron': os.environ.get('CRON', f'{i % 60} {i % 24} * * *'), 'payload': 'x'})
    assert s == 201, (s, r)
out['create_s'] = round(time.time() - t, 1)
time.sleep(5)
out['rss_mib_10k_idle'] = rss(host.pid)
m0 = conn_in_msgs(); time.sleep(60); m1 = conn_in_msgs()
out['nats_msgs_from_clients_per_min_idle'] = m1 - m0
# Lag: 20 schedules every second for 60 s.
for i in range(20):
    s, r = call('POST', base + '/v1/schedules', {'name': f'beat-{i:02d}', 'agent': 'echo', 'every': '1s', 'payload': 'x'})
    assert s == 201, (s, r)
time.sleep(62)
for i in range(20):
    call('POST', base + f'/v1/schedules/beat-{i:02d}/pause', {})
time.sleep(3)
lags = []
cursor = None
for i in range(20):
    s, v = call('GET', base + f'/v1/schedules/beat-{i:02d}')
    for o in v['outcomes']:
        if o.get('dispatch'):
            s2, dd = call('GET', base + f"/v1/dispatches/{urllib.parse.quote(o['dispatch'], safe='')}")
            if s2 == 200 and dd.get('started_at'):
                lags.append(dd['started_at'] - o['fire'])
lags.sort()
out['lag_samples'] = len(lags)
if lags:
    out['lag_ms_p50'] = lags[len(lags) // 2]
    out['lag_ms_p99'] = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    out['lag_ms_max'] = lags[-1]
print(json.dumps(out))
host.terminate(); host.wait(20)
if nats: nats.terminate(); nats.wait(10)
