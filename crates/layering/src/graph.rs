//! What one source file names: the paths it uses (resolved against its own module) and the
//! engine parts it reaches through the server's state, each with its line.

use syn::visit::Visit;

/// One name a file uses, as absolute segments (`crate`, a crate name, then modules).
#[derive(Debug, Clone)]
pub struct Named {
    pub path: Vec<String>,
    pub line: usize,
}

/// Everything [`scan`] reads from one file.
#[derive(Debug, Default)]
pub struct Scanned {
    pub paths: Vec<Named>,
    /// Fields read on a binding of the server's state (`State(st)`, `st: &AppState`, the `st`
    /// of a destructured call, the first of `call.into_parts()`), and the accessors called on
    /// its shop (`st.shop.ledger()`), each as `AppState::<name>`.
    pub state_fields: Vec<Named>,
}

/// Parses `source` as the file of module `module` (its segments below the crate root).
pub fn scan(source: &str, module: &[String]) -> anyhow::Result<Scanned> {
    let file = syn::parse_file(source)?;
    let mut v = Visitor {
        module: module.to_vec(),
        out: Scanned::default(),
        state_names: Vec::new(),
    };
    v.visit_file(&file);
    Ok(v.out)
}

struct Visitor {
    module: Vec<String>,
    out: Scanned,
    /// Names bound to the server's state in the function being read.
    state_names: Vec<String>,
}

impl Visitor {
    /// `crate::a`, `super::a`, `self::a` to absolute segments; other paths as written.
    fn resolve(&self, segments: Vec<String>) -> Vec<String> {
        let mut base: Vec<String> = vec!["crate".into()];
        base.extend(self.module.iter().cloned());
        let mut rest = segments.as_slice();
        match rest.first().map(String::as_str) {
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
            _ => return segments,
        }
        base.extend(rest.iter().cloned());
        base
    }

    fn push(&mut self, segments: Vec<String>, line: usize) {
        let path = self.resolve(segments);
        self.out.paths.push(Named { path, line });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, line: usize) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, line);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.push(with(prefix, &n.ident), line),
            syn::UseTree::Rename(r) => self.push(with(prefix, &r.ident), line),
            syn::UseTree::Glob(_) => self.push(prefix.clone(), line),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(prefix, t, line)),
        }
    }
}

impl Visitor {
    /// Whether `e` is a name bound to the server's state.
    fn is_state(&self, e: &syn::Expr) -> bool {
        let syn::Expr::Path(p) = e else {
            return false;
        };
        let bound = p.path.get_ident().map(|i| i.to_string());
        bound.is_some_and(|b| self.state_names.contains(&b))
    }
}

fn with(prefix: &[String], ident: &syn::Ident) -> Vec<String> {
    let mut p = prefix.to_vec();
    if ident != "self" {
        p.push(ident.to_string());
    }
    p
}

fn line_of(span: proc_macro2::Span) -> usize {
    span.start().line
}

/// The names a parameter pattern binds to the server's state: `State(st)`, `State(st): State<…>`,
/// `st: &AppState` or the `st` field of a destructured call (`AdminOn { st, .. }`).
fn state_bindings(arg: &syn::FnArg) -> Option<String> {
    let syn::FnArg::Typed(pt) = arg else {
        return None;
    };
    let ty = quote_type(&pt.ty);
    match &*pt.pat {
        syn::Pat::TupleStruct(ts) if ts.path.segments.last()?.ident == "State" => {
            match ts.elems.first()? {
                syn::Pat::Ident(i) => Some(i.ident.to_string()),
                _ => None,
            }
        }
        syn::Pat::Ident(i) if ty.contains("AppState") => Some(i.ident.to_string()),
        pat => st_field(pat),
    }
}

/// The binding of the `st` field in a struct pattern (`Call { st, .. }`).
fn st_field(pat: &syn::Pat) -> Option<String> {
    let syn::Pat::Struct(ps) = pat else {
        return None;
    };
    let field = ps.fields.iter().find(|f| match &f.member {
        syn::Member::Named(n) => n == "st",
        syn::Member::Unnamed(_) => false,
    })?;
    match &*field.pat {
        syn::Pat::Ident(i) => Some(i.ident.to_string()),
        _ => None,
    }
}

/// The name a `let` binds to the server's state: the first of `let (st, ..) =
/// call.into_parts()`, or the `st` field of a destructured call.
fn let_binding(local: &syn::Local) -> Option<String> {
    if let Some(name) = st_field(&local.pat) {
        return Some(name);
    }
    let init = local.init.as_ref()?;
    let syn::Expr::MethodCall(call) = &*init.expr else {
        return None;
    };
    let syn::Pat::Tuple(t) = &local.pat else {
        return None;
    };
    match (call.method == "into_parts", t.elems.first()?) {
        (true, syn::Pat::Ident(i)) => Some(i.ident.to_string()),
        _ => None,
    }
}

fn quote_type(ty: &syn::Type) -> String {
    use quote::ToTokens;
    ty.to_token_stream().to_string()
}

impl<'ast> Visit<'ast> for Visitor {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let line = line_of(u.use_token.span);
        self.use_tree(&mut Vec::new(), &u.tree, line);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = p.segments.first() {
            self.push(segments, line_of(first.ident.span()));
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        let saved = std::mem::take(&mut self.state_names);
        self.state_names = f.sig.inputs.iter().filter_map(state_bindings).collect();
        syn::visit::visit_item_fn(self, f);
        self.state_names = saved;
    }

    fn visit_local(&mut self, local: &'ast syn::Local) {
        if let Some(name) = let_binding(local) {
            self.state_names.push(name);
        }
        syn::visit::visit_local(self, local);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if let syn::Expr::Field(f) = &*call.receiver {
            let on_shop = matches!(&f.member, syn::Member::Named(m) if m == "shop");
            if on_shop && self.is_state(&f.base) {
                let line = line_of(call.method.span());
                let path = vec!["AppState".into(), call.method.to_string()];
                self.out.state_fields.push(Named { path, line });
            }
        }
        syn::visit::visit_expr_method_call(self, call);
    }

    fn visit_expr_field(&mut self, e: &'ast syn::ExprField) {
        if let (syn::Expr::Path(base), syn::Member::Named(field)) = (&*e.base, &e.member) {
            let bound = base.path.get_ident().map(|i| i.to_string());
            if bound.is_some_and(|b| self.state_names.contains(&b)) {
                let line = line_of(field.span());
                let path = vec!["AppState".into(), field.to_string()];
                self.out.state_fields.push(Named { path, line });
            }
        }
        syn::visit::visit_expr_field(self, e);
    }
}
