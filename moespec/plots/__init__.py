"""One function per paper figure, grouped by topic (routing, theory, bandwidth, predictions, oracle).

Every function takes data frames or arrays computed in the current run, draws one figure and
returns the matplotlib Figure; notebooks save it with :func:`moespec.io.save_figure`. Published
values, when drawn, are labelled as the paper's.
"""
