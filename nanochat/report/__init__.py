"""The report: report/README.md and its figures from run directories, in the KromHC paper's
layout, with the paper's numbers beside ours.

    runs     reading run directories; the values a table shows (train loss, val bpb, CORE,
             parameters, diagnostics); matching runs to the paper's rows; seed groups
    tables   the paper's tables (Tables 3-9) and the project's own (identity, stability)
    seeds    paired differences over seeds and the sentence that weighs them (Holm-Bonferroni)
    compute  what a finished run spent and reached (FLOPs, tokens, seconds, val curve), recorded
             or, for runs from before the records, reconstructed
    cm       the compute-multiplier study: baseline and variants, every reading, intervals
    cm_section  its markdown and figures (scripts.compare, the report's section; the iso-FLOP hook)
    figures  loss, loss-gap and gradient-norm curves, parameters against n (PNG)
    format   markdown cells: numbers, seeds as mean ± std, the dash for a missing value
    stats    mean, standard deviation, Student's t interval of a paired difference, exact t
             p-values and Holm-Bonferroni
    paper    the paper's published numbers, as data
    build    write_report: the sections in order

Nothing here imports matplotlib until a figure is drawn (`figures` and `build` do), so that
`format` and `paper` serve machines without it.
"""
