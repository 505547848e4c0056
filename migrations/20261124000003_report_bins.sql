-- Bin maps of the report's task (DESIGN.md "Tasks with bin maps"): a JSON array with one
-- array of cut points per factor attribute, or '' when the task binned no attribute (every
-- report stored before this migration). The table a report counts in is (round, factor,
-- mechanism, bins).
ALTER TABLE reports ADD COLUMN bins TEXT NOT NULL DEFAULT '';
