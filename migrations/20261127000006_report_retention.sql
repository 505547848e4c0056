-- Report retention (`retain_reports_days` of a collection's config). `finalized_at`: when the
-- collection was finalized, Unix seconds (NULL: open, or finalized before this migration, so
-- its reports are kept). `reports_deleted_at`: when its raw reports (and vertical records)
-- were deleted by the retention sweep (NULL: kept); its tables, counts and state stay.
ALTER TABLE collections ADD COLUMN finalized_at BIGINT;
ALTER TABLE collections ADD COLUMN reports_deleted_at BIGINT;
