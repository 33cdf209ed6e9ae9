#!/usr/bin/env python3
"""Writes the policy of the scale benchmarks: many steered names, many regions each.

  scale_policy.py OUTDIR [NAMES [REGIONS]]     # defaults: 1000 names, 20 regions

Writes into OUTDIR:
  steering.yaml          `hostnames:` with NAMES names h0000.example.com, ... each with
                         three CDNs and REGIONS regions: first an office region (a CIDR
                         block per family, as operators pin their own networks), then
                         groups of 6 to 8 countries (drawn per name, so every name's
                         table differs), one of two continents, and the default "*";
  zones/example.com.zone the demo zone (the steered names live in it);
  names.txt              the steered names, one a line;
  scale.bin              QUERIES (default 20000) queries in dnsperf's binary format (-B):
                         a random steered name each, A, with ECS from the prefix list
                         given as PREFIXES (a benches/queries.py prefix file), if set.
The random seed is fixed, so every run writes the same files.
"""
import os
import random
import shutil
import sys

# ISO 3166 codes steerdns knows (src/dns/countries.rs), by continent.
COUNTRIES = {
    "AF": "AO BF BI BJ BW CD CF CG CI CM CV DJ DZ EG EH ER ET GA GH GM GN GQ GW KE KM LR "
          "LS LY MA MG ML MR MU MW MZ NA NE NG RE RW SC SD SH SL SN SO SS ST SZ TD TG TN "
          "TZ UG YT ZA ZM ZW",
    "AS": "AE AF AM AZ BD BH BN BT CC CN CX GE HK ID IL IN IO IQ IR JO JP KG KH KP KR KW "
          "KZ LA LB LK MM MN MO MV MY NP OM PH PK PS QA SA SG SY TH TJ TL TM TR TW UZ VN YE",
    "EU": "AD AL AT AX BA BE BG BY CH CY CZ DE DK EE ES FI FO FR GB GG GI GR HR HU IE IM "
          "IS IT JE LI LT LU LV MC MD ME MK MT NL NO PL PT RO RS RU SE SI SJ SK SM UA VA XK",
    "NA": "AG AI AW BB BL BM BQ BS BZ CA CR CU CW DM DO GD GL GP GT HN HT JM KN KY LC MF "
          "MQ MS MX NI PA PM PR SV SX TC TT US VC VG VI",
    "OC": "AS AU CK FJ FM GU KI MH MP NC NF NR NU NZ PF PG PN PW SB TK TO TV UM VU WF WS",
    "SA": "AR BO BR CL CO EC FK GF GY PE PY SR UY VE",
}
CDNS = ("fastly", "cloudflare", "akamai")


def host(i, regions, rng):
    name = f"h{i:04d}.example.com"
    out = [f"  {name}:", "    ttl: 30", "    incident_ttl: 10", "    cdns:"]
    for cdn in CDNS:
        out.append(f"      {cdn}: {{ cname: h{i:04d}.{cdn}.example.net. }}")
    out.append("    regions:")
    countries = [c for codes in COUNTRIES.values() for c in codes.split()]
    rng.shuffle(countries)

    def weights():
        # Every CDN keeps at least 10 % (a smaller share is warned about).
        w = [rng.randint(10, 80) for _ in CDNS]
        while min(w) * 10 < sum(w):
            w[w.index(min(w))] += 5
        return ", ".join(f"{c}: {x}" for c, x in zip(CDNS, w))

    def region(n, match):
        out.append(f"      - name: r{n:02d}")
        out.append(f"        match: [{', '.join(match)}]")
        out.append(f"        weights: {{ {weights()} }}")

    region(0, [f"198.51.{i % 256}.0/24", f"\"2001:db8:{i:x}::/48\""])
    for n in range(1, regions - 2):
        k = rng.randint(6, 8)
        region(n, [countries.pop() for _ in range(k)])
    region(regions - 2, [f"\"continent:{rng.choice(['EU', 'AS', 'NA'])}\"", "\"continent:OC\""])
    region(regions - 1, ['"*"'])
    out += ["    failover:", "      steps: [50, 100]", "      step_interval_seconds: 90"]
    return name, out


def main():
    out = sys.argv[1]
    names = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    regions = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    if regions < 3:
        sys.exit("scale_policy.py: at least 3 regions (office, continents, default)")
    rng = random.Random(4)
    os.makedirs(f"{out}/zones", exist_ok=True)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shutil.copy(f"{repo}/zones/example.com.zone", f"{out}/zones/example.com.zone")
    lines = [f"# {names} steered names x {regions} regions: benches/scale_policy.py", "hostnames:"]
    all_names = []
    for i in range(names):
        name, text = host(i, regions, rng)
        all_names.append(name)
        lines += text
    with open(f"{out}/steering.yaml", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(f"{out}/names.txt", "w") as f:
        f.write("\n".join(all_names) + "\n")
    prefixes = os.environ.get("PREFIXES")
    if prefixes:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import queries
        count = int(os.environ.get("QUERIES", "20000"))
        nets = queries.subnets(prefixes, rng)
        queries.write_bin(f"{out}/scale.bin",
                          (queries.message(rng.choice(all_names), "A", next(nets)) for _ in range(count)))


if __name__ == "__main__":
    main()
