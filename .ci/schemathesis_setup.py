"""Seeds a live `serve` for the schemathesis run (.ci/schemathesis.sh) and writes its config.

Creates, over the public API with the admin token:
  - an open `privincr` collection (tasks and reports see a collection that takes reports),
  - an `independence` collection fed with randomized reports from its own tasks, then
    finalized (model, marginals and synthetic downloads see a model),
  - a `vertical` collection with two parties, fed with records and finalized, and an open one
    (party routes see real party names),
  - a throwaway `independence` collection, the only one `DELETE /v1/collections/{id}` is sent
    (the seeded ones stay for the other operations).
Then writes schemathesis.toml: the admin token on every request, and dictionaries so that most
generated `id`, `party` and `attrs` values are these collections' (the rest stay random).

Usage: schemathesis_setup.py BASE_URL ADMIN_TOKEN OUT_TOML
"""

import base64
import json
import random
import sys
import urllib.request

base, token, out = sys.argv[1], sys.argv[2], sys.argv[3]
rng = random.Random(7)


def call(method, path, body=None, bearer=token):
    req = urllib.request.Request(base + path, method=method)
    req.add_header("Authorization", f"Bearer {bearer}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, data, timeout=60) as r:
        return json.load(r)


LABELS = {"sex": ["F", "M"], "smoker": ["no", "yes"], "region": ["n", "e", "s", "w"]}
schema = {"attributes": [{"name": n, "type": "categorical", "labels": l} for n, l in LABELS.items()]}
dims = [len(l) for l in LABELS.values()]

open_device = call("POST", "/v1/collections",
                   {"schema": schema, "protocol": "privincr", "epsilon": 2, "target_users": 100000})
fed = call("POST", "/v1/collections",
           {"schema": schema, "protocol": "independence", "epsilon": 2, "target_users": 300})


def payload(task):
    # A uniformly random output of the task's mechanism over its (binned) factor domain.
    sizes = []
    for i, a in enumerate(task["factor"]):
        cuts = task.get("bins", [])[i] if task.get("bins") else []
        sizes.append(len(cuts) + 1 if cuts else dims[a])
    k = 1
    for s in sizes:
        k *= s
    if task["mechanism"] == "grr":
        return {"grr": rng.randrange(k)}
    if task["mechanism"] == "grr_pair":
        return {"grr_pair": [rng.randrange(s) for s in sizes]}
    bits = bytearray((k + 7) // 8)
    for i in range(k):
        if rng.random() < 0.5:
            bits[i // 8] |= 1 << (i % 8)
    return {"oue": base64.urlsafe_b64encode(bytes(bits)).decode().rstrip("=")}


tasks = call("GET", f"/v1/collections/{fed['id']}/task?count=300")
reports = [{"id": str(__import__("uuid").UUID(int=rng.getrandbits(128), version=4)),
            "token": t["token"], "payload": payload(t)} for t in tasks]
answers = call("POST", f"/v1/collections/{fed['id']}/reports", reports)
accepted = sum(a["status"] == "accepted" for a in answers)
assert accepted == len(reports), [a for a in answers if a["status"] != "accepted"][:3]
call("POST", f"/v1/collections/{fed['id']}/finalize")

parties = [
    {"name": "bank", "attributes": [{"name": "sex", "epsilon": 2}, {"name": "smoker", "epsilon": 2}]},
    {"name": "telecom", "attributes": [{"name": "region", "epsilon": 2}]},
]
# Encoding `fo`: the parties upload per-record reports (the default, sketch+locmrf, takes none).
fo = {"schema": schema, "protocol": "vertical", "encoding": "fo", "target_users": 200,
      "parties": parties}
vertical = call("POST", "/v1/collections", fo)
open_vertical = call("POST", "/v1/collections", fo)
ids = ["%064x" % rng.getrandbits(256) for _ in range(200)]
for p, tok in vertical["party_tokens"].items():
    attrs = next(q["attributes"] for q in parties if q["name"] == p)
    records = [{"id": i, "codes": [rng.randrange(len(LABELS[a["name"]])) for a in attrs]} for i in ids]
    r = call("POST", f"/v1/collections/{vertical['id']}/parties/{p}/records", {"records": records},
             bearer=tok)
    assert r["accepted"] == len(ids), r
call("POST", f"/v1/collections/{vertical['id']}/finalize")

doomed = call("POST", "/v1/collections",
              {"schema": schema, "protocol": "independence", "epsilon": 2, "target_users": 10})

collections = [open_device["id"], fed["id"], vertical["id"], open_vertical["id"]]
toml = f"""# Written by .ci/schemathesis_setup.py for one run against a live serve.
headers = {{ Authorization = "Bearer {token}" }}

[dictionaries.collections]
values = {json.dumps(collections)}

[dictionaries.parties]
values = ["bank", "telecom"]

[dictionaries.attrs]
values = ["sex", "region,smoker", "sex,smoker,region", "smoker"]

[dictionaries.files]
values = ["app.js", "api.js", "charts.js", "style.css", "index.html"]

[parameters]
"path.id" = {{ dictionary = "collections", probability = 0.8 }}
"path.party" = {{ dictionary = "parties", probability = 0.8 }}
"path.file" = {{ dictionary = "files", probability = 0.7 }}
"query.attrs" = {{ dictionary = "attrs", probability = 0.7 }}

# Party uploads with the open vertical collection's `bank` token, so generated records reach
# the commit path (the admin token is refused there).
[[operations]]
include-path = "/v1/collections/{{id}}/parties/{{party}}/records"
headers = {{ Authorization = "Bearer {open_vertical['party_tokens']['bank']}" }}
parameters = {{ "path.id" = "{open_vertical['id']}", "path.party" = "bank" }}

# Deletes go to the throwaway collection only (deleted by the first, 404 after).
[[operations]]
include-path = "/v1/collections/{{id}}"
include-method = "DELETE"
parameters = {{ "path.id" = "{doomed['id']}" }}
"""
open(out, "w").write(toml)
print(f"seeded {len(collections)} collections ({accepted} device reports, {len(ids)} vertical "
      f"records per party; 2 finalized): {', '.join(collections)}")
