"""Writes a generated bank-like table (45,211 rows) to stdout: age, job, a heavy-tailed
balance (8% exactly 0, 8% negative, a log-normal bulk around 700, capped at 102,127),
campaign, previous (82% zero) and y. Seeded, standard library only. The data is made up;
it stands in for the public bank-marketing tables whose balance column issue 12 describes.

    python3 examples/bank/generate.py > bank.csv
"""
import csv
import random
import sys

random.seed(7)
w = csv.writer(sys.stdout)
w.writerow(["age", "job", "balance", "campaign", "previous", "y"])
jobs = ["admin", "blue-collar", "technician", "services", "management", "retired",
        "student", "unemployed"]
for _ in range(45211):
    age = int(min(95, max(18, random.gauss(41, 10.6))))
    job = random.choice(jobs)
    r = random.random()
    if r < 0.08:
        balance = -int(random.expovariate(1 / 600))
    elif r < 0.16:
        balance = 0
    else:
        balance = int(random.lognormvariate(6.6, 1.3))
    balance = max(-8019, min(102127, balance))
    campaign = 1 + int(random.expovariate(0.5))
    previous = 0 if random.random() < 0.82 else 1 + int(random.expovariate(0.6))
    p = 0.08 + 0.1 * (previous > 0) + 0.05 * (age > 60)
    y = "yes" if random.random() < p else "no"
    w.writerow([age, job, balance, campaign, previous, y])
