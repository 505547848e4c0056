//! Layer 5: one graphical model fitted to every measurement: the observations and the fit
//! ([`observe`], [`pgm`]), its residuals ([`residuals`]), a numeric attribute's smoothed
//! 1-way ([`smooth`]) and the fit with its standard errors ([`joint`], from its
//! measurements or a parametric bootstrap of it, [`bootstrap`]).

pub mod bootstrap;
pub mod joint;
pub mod observe;
pub mod pgm;
pub mod residuals;
pub mod smooth;
