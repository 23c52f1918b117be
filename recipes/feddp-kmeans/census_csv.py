"""Build the thesis's US census clustering data (App. D.7.1) as the csv files pflx reads.

Input: an ACS 2018 1-year person file as folktables downloads it (``psam_p*.csv`` or the
``2018/1-Year/*.csv`` that ``folktables.ACSDataSource(survey_year="2018", horizon="1-Year",
survey="person").get_data(download=True)`` writes); nothing is downloaded here.

Steps, as the thesis describes them:
- ACSIncome's rows and features (folktables ``adult_filter``: AGEP > 16, PINCP > 100, WKHP > 0,
  PWGTP >= 1; features AGEP, COW, SCHL, MAR, OCCP, POBP, RELP, WKHP, SEX, RAC1P), each feature
  one-hot encoded over the values the filtered data hold (the thesis: d = 819 binary features; the
  count printed here depends on the file and is compared with 819, not forced to it);
- clients: the people of one employment type (``--cow``; 2 not-for-profit, 5 federal, 6
  self-employed as in Figures 6.1, D.6, D.7), one client per state (``ST``, 51 clients);
- server data: 20 people of that type plus 1000 of another type (``--server-cow``; the thesis
  does not name it [I]), drawn without replacement and removed from the clients.

Writes ``clients.csv`` (``ST`` then the features) and ``server.csv`` (the features) under ``--out``;
recipes/feddp-kmeans/census.yaml reads them:

    python recipes/feddp-kmeans/census_csv.py --acs psam_p.csv --cow 5 --out data/census-federal
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

FEATURES = ("AGEP", "COW", "SCHL", "MAR", "OCCP", "POBP", "RELP", "WKHP", "SEX", "RAC1P")
FILTER_COLUMNS = ("PINCP", "PWGTP")
THESIS_DIM = 819


def read_acs(path: Path) -> dict[str, np.ndarray]:
    """The columns census needs, as float arrays (empty cells NaN); names the first missing column."""
    import csv

    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        wanted = ("ST", *FEATURES, *FILTER_COLUMNS)
        missing = [c for c in wanted if c not in header]
        if missing:
            raise SystemExit(f"{path}: column {missing[0]} is missing; give an ACS person file (psam_p*.csv).")
        cols = [header.index(c) for c in wanted]
        rows = [[row[i] for i in cols] for row in reader]
    table = np.asarray(rows, dtype=object).reshape(-1, len(wanted))
    return {name: np.asarray([float(v) if v.strip() else np.nan for v in table[:, j]]) for j, name in enumerate(wanted)}


def acs_income_rows(acs: dict[str, np.ndarray]) -> np.ndarray:
    """folktables' adult_filter, the ACSIncome task's rows."""
    with np.errstate(invalid="ignore"):
        return (acs["AGEP"] > 16) & (acs["PINCP"] > 100) & (acs["WKHP"] > 0) & (acs["PWGTP"] >= 1)


def one_hot(acs: dict[str, np.ndarray], rows: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Each feature one-hot over the values the kept rows hold (NaN is a value of its own)."""
    blocks, names = [], []
    for name in FEATURES:
        col = np.nan_to_num(acs[name][rows], nan=-1).astype(np.int64)
        values = np.unique(col)
        blocks.append((col[:, None] == values[None, :]).astype(np.uint8))
        names += [f"{name}_{v}" for v in values]
    return np.concatenate(blocks, axis=1), names


def build(acs: dict[str, np.ndarray], cow: int, server_cow: int, rng: np.random.Generator,
          n_server_same: int = 20, n_server_other: int = 1000):
    """(client states, client features, server features, feature names)."""
    rows = acs_income_rows(acs)
    x, names = one_hot(acs, rows)
    kind = acs["COW"][rows]
    same, other = np.flatnonzero(kind == cow), np.flatnonzero(kind == server_cow)
    if len(same) <= n_server_same or len(other) < n_server_other:
        raise SystemExit(f"need more than {n_server_same} people of COW {cow} and {n_server_other} of COW "
                         f"{server_cow}; the file has {len(same)} and {len(other)}.")
    server_same = rng.choice(same, size=n_server_same, replace=False)
    server = np.concatenate([server_same, rng.choice(other, size=n_server_other, replace=False)])
    clients = np.setdiff1d(same, server_same)
    states = np.asarray([f"{int(s):02d}" for s in acs["ST"][rows][clients]])
    return states, x[clients], x[server], names


def write_csv(path: Path, header: list[str], x: np.ndarray, first: np.ndarray | None = None) -> None:
    lines = [",".join(header)]
    body = x.astype(str)
    for i in range(len(x)):
        cells = ",".join(body[i])
        lines.append(cells if first is None else f"{first[i]},{cells}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--acs", type=Path, required=True, help="ACS 2018 person csv (folktables' download)")
    ap.add_argument("--cow", type=int, default=5, help="clients' class of worker (2, 5 or 6 in the thesis)")
    ap.add_argument("--server-cow", type=int, default=1, help="the server's other class of worker [I]")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--server-other", type=int, default=1000, help="server points of the other type (thesis: 1000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    states, clients, server, names = build(read_acs(args.acs), args.cow, args.server_cow,
                                           np.random.default_rng(args.seed), n_server_other=args.server_other)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "clients.csv", ["ST", *names], clients, states)
    write_csv(args.out / "server.csv", names, server)
    print(f"{len(clients)} client points in {len(set(states))} states, {len(server)} server points, "
          f"d = {len(names)} one-hot features (thesis: {THESIS_DIM}) -> {args.out}")


if __name__ == "__main__":
    main()
