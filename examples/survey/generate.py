"""Writes a generated survey-like table (21,574 rows, 16 yes/no questions) to stdout: two
correlated latent traits, questions q0–q5 loading on the first, q6–q11 on the second,
q12–q15 on both, and every fourth question (q1, q5, q9, q13) leaning on the one before it.
Seeded, standard library only. The data is made up; it stands in for the public survey set
of 21,574 people and 16 binary attributes that issues 10 and 11 describe (dense dependence:
every pair related, no tree captures it).

    python3 examples/survey/generate.py > survey.csv
"""
import csv
import math
import random
import sys

random.seed(11)
K = 16
LOADINGS = [(1.6, 0.0) if i < 6 else (0.0, 1.5) if i < 12 else (0.9, 0.9) for i in range(K)]
BASE = [-0.5 + 0.15 * i for i in range(K)]
w = csv.writer(sys.stdout, lineterminator="\n")
w.writerow([f"q{i}" for i in range(K)])
for _ in range(21574):
    t1 = random.gauss(0, 1)
    t2 = 0.4 * t1 + random.gauss(0, 0.9)
    row = []
    for i in range(K):
        z = BASE[i] + LOADINGS[i][0] * t1 + LOADINGS[i][1] * t2
        if i % 4 == 1:
            z += 1.2 * (row[-1] - 0.5)
        row.append(1 if random.random() < 1 / (1 + math.exp(-z)) else 0)
    w.writerow(["yes" if v else "no" for v in row])
