"""Load a collection's synthetic data and a marginal with its error bars into pandas.

usage: LDPSYN_ADMIN_TOKEN=… python3 read_synthetic.py BASE_URL COLLECTION_ID ROWS ATTR[,ATTR]

The README's analyst recipe, run by the CLI integration test (aggregator/tests/admin_cli.rs)
against a live `serve` when LDPSYN_PYTHON points at a Python with pandas and pyarrow (`.ci/run`
makes one).
"""
import io
import json
import os
import sys
import urllib.request

import pandas as pd

base, collection, rows, attrs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
auth = {"Authorization": f"Bearer {os.environ['LDPSYN_ADMIN_TOKEN']}"}
url = f"{base}/v1/collections/{collection}"

# Synthetic rows: CSV and NDJSON straight from the API (same seed, same rows).
csv = pd.read_csv(f"{url}/synthetic?rows={rows}&seed=7", storage_options=auth)
nd = pd.read_json(f"{url}/synthetic?rows={rows}&seed=7&format=ndjson", lines=True,
                  storage_options=auth)
# Parquet: typed columns (integers Int64, reals float64, categoricals as pandas categories).
req = urllib.request.Request(f"{url}/synthetic?rows={rows}&seed=7&format=parquet", headers=auth)
pq = pd.read_parquet(io.BytesIO(urllib.request.urlopen(req).read()))

# A marginal with standard errors, indexed by the attributes' labels.
req = urllib.request.Request(f"{url}/marginals?attrs={attrs}", headers=auth)
m = json.load(urllib.request.urlopen(req))
marginal = pd.DataFrame(
    {"frequency": m["frequencies"], "std_error": m["std_errors"] or [None] * len(m["frequencies"])},
    index=pd.MultiIndex.from_product(m["labels"], names=m["attributes"]),
)

assert len(csv) == rows and len(nd) == rows, (len(csv), len(nd))
assert list(csv.columns) == list(nd.columns)
assert (csv.astype(str).values == nd.astype(str).values).all(), "CSV and NDJSON rows differ"
assert len(pq) == rows and list(pq.columns) == list(csv.columns)
for c in pq.columns:
    if isinstance(pq[c].dtype, pd.CategoricalDtype):
        assert (pq[c].astype(str).values == csv[c].astype(str).values).all(), c
    else:
        assert (abs(pq[c].astype(float) - csv[c].astype(float)) < 1e-9).all(), c
assert abs(marginal["frequency"].sum() - 1) < 1e-9
print(f"{len(csv)} rows × {len(csv.columns)} columns; marginal of {attrs}:")
print(marginal.round(4).to_string())
