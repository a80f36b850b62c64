-- Migration 4: every delivery keeps the last error a nack or reject recorded
-- (NULL: none). The eight-argument settle of earlier versions is dropped: an
-- overload beside functions/settle.sql (which takes the error as a ninth,
-- optional argument) would make calls with eight arguments ambiguous.

ALTER TABLE {s}.deliveries ADD COLUMN last_error text;

DROP FUNCTION IF EXISTS {s}.settle(smallint, integer[], integer[], bigint[], uuid[], integer[], text, bigint);
