"""What the `prefix_credit` probe (experiments/probes/prefix_credit.py) measures and its page
(experiments/reports/prefix_credit_report.py) shows: the runs read, the credits compared, the node
classes, the histogram's edges and the concentration share. Its own module so that the probe
imports its report and the report imports nothing of the probe."""

RUNS = {"GSPO": "gspo", "IBPO-GSPO": "ibpo_gspo"}  # final policies read: label -> algo
CREDITS = {"gspo": ("gspo", ()), "ibpo_seq": ("ibpo_gspo", ()),  # name -> (algo, overrides)
           "ibpo_token": ("ibpo_gspo", (("ibpo.credit", "token"),))}
CREDIT_LABELS = {"gspo": "GSPO", "ibpo_seq": "IBPO (sequence)", "ibpo_token": "IBPO (token)"}
CLASSES = ("shared", "unshared", "post_error", "correct_only")
CLASS_LABELS = ("(a) shared right prefix", "(b) unshared right prefix", "(c) post-error",
                "(d) correct only")
EDGES = [round(-8 + 0.2 * k, 1) for k in range(81)]  # histogram of net weight (clipped to ±8)
SHARE = 0.8  # concentration: the fewest nodes that carry this share of IBPO's change
